/**
 * @file idl_name.h
 * @brief File names a device accepts (protocol/ymodem.py check_name): one plain path component,
 *        valid UTF-8, no control or invisible format character, nothing Windows would change.
 *
 * Rules, in this order (the first that fails is the refusal): empty; longer than `max` bytes;
 * not strict UTF-8 (overlong forms, surrogates and code points past U+10FFFF are invalid);
 * a control character (U+0000-001F, U+007F-009F); starts with '/' or '\\'; a drive letter
 * ("C:") or any ':'; a '/' or '\\' inside; "." or ".."; a Unicode format character
 * (category Cf: bidi overrides, zero-width joiners, BOM...); a Windows device name (CON, PRN,
 * AUX, NUL, COM1-9, LPT1-9, also with superscript digits, any case, with any extension and
 * trailing spaces before it); ends in '.' or ' '.
 */
#ifndef IDL_NAME_H
#define IDL_NAME_H

#include "idl_checkreturn.h"

#include <stddef.h>
#include <stdint.h>

/** The refusals, in the order of protocol/ymodem.py NameRefusal's checks. */
typedef enum {
    IDL_NAME_OK = 0,
    IDL_NAME_EMPTY = 1,
    IDL_NAME_TOO_LONG = 2,
    IDL_NAME_NOT_UTF8 = 3,
    IDL_NAME_CONTROL_CHAR = 4,
    IDL_NAME_ABSOLUTE = 5,
    IDL_NAME_DRIVE_LETTER = 6,
    IDL_NAME_PATH_SEPARATOR = 7,
    IDL_NAME_DOT_DOT = 8,
    IDL_NAME_FORMAT_CHAR = 9,
    IDL_NAME_RESERVED_DEVICE = 10,
    IDL_NAME_TRAILING_DOT_SPACE = 11
} idl_name_verdict_t;

IDL_CHECKRETURN idl_name_verdict_t idl_name_check(const uint8_t *name, size_t n, size_t max);

#endif /* IDL_NAME_H */
