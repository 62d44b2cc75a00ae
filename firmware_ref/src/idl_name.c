/* File name rules: see idl_name.h. */
#include "idl_name.h"

#include <stdbool.h>

/* Unicode category Cf as Python 14.0.0 sees it (tests/test_c_device.py compares this table
 * with the running Python's unicodedata; regenerate it if that test fails). One uint32_t per
 * range, first code point << 8 | (last - first): half the size of (first, last) pairs; the
 * first code point fits 21 bits and no range is longer than 256. */
#define IDL_CF(first, extra) (((uint32_t)(first) << 8) | (uint32_t)(extra))
static const uint32_t FORMAT_CHARS[] = {
    IDL_CF(0x000ADu, 0u), IDL_CF(0x00600u, 5u), IDL_CF(0x0061Cu, 0u), IDL_CF(0x006DDu, 0u),
    IDL_CF(0x0070Fu, 0u), IDL_CF(0x00890u, 1u), IDL_CF(0x008E2u, 0u), IDL_CF(0x0180Eu, 0u),
    IDL_CF(0x0200Bu, 4u), IDL_CF(0x0202Au, 4u), IDL_CF(0x02060u, 4u), IDL_CF(0x02066u, 9u),
    IDL_CF(0x0FEFFu, 0u), IDL_CF(0x0FFF9u, 2u), IDL_CF(0x110BDu, 0u), IDL_CF(0x110CDu, 0u),
    IDL_CF(0x13430u, 8u), IDL_CF(0x1BCA0u, 3u), IDL_CF(0x1D173u, 7u), IDL_CF(0xE0001u, 0u),
    IDL_CF(0xE0020u, 95u)
};

/* Decode one strict UTF-8 sequence at p[0..n); returns its length (0: invalid) and *cp. */
static size_t utf8_next(const uint8_t *p, size_t n, uint32_t *cp)
{
    uint8_t b = p[0];
    size_t len;
    size_t i;
    uint32_t v;
    uint32_t min;
    if (b < 0x80u) {
        *cp = b;
        return 1;
    }
    if (b >= 0xC2u && b <= 0xDFu) {
        len = 2;
        v = b & 0x1Fu;
        min = 0x80u;
    } else if (b >= 0xE0u && b <= 0xEFu) {
        len = 3;
        v = b & 0x0Fu;
        min = 0x800u;
    } else if (b >= 0xF0u && b <= 0xF4u) {
        len = 4;
        v = b & 0x07u;
        min = 0x10000u;
    } else {
        return 0;
    }
    if (len > n) {
        return 0;
    }
    for (i = 1; i < len; i++) {
        if ((p[i] & 0xC0u) != 0x80u) {
            return 0;
        }
        v = (v << 6) | (p[i] & 0x3Fu);
    }
    if (v < min || v > 0x10FFFFu || (v >= 0xD800u && v <= 0xDFFFu)) {
        return 0;
    }
    *cp = v;
    return len;
}

static bool is_format(uint32_t cp)
{
    size_t i;
    for (i = 0; i < sizeof FORMAT_CHARS / sizeof FORMAT_CHARS[0]; i++) {
        /* unsigned: below the first code point wraps to a large offset */
        if (cp - (FORMAT_CHARS[i] >> 8) <= (FORMAT_CHARS[i] & 0xFFu)) {
            return true;
        }
    }
    return false;
}

static uint8_t upper(uint8_t c) { return (uint8_t)((c >= 'a' && c <= 'z') ? c - 32 : c); }

/* CON PRN AUX NUL, or COM/LPT + 1-9 / superscript 1-3, as the whole of p[0..n) (any case). */
static bool reserved(const uint8_t *p, size_t n)
{
    static const char three[] = "CONPRNAUXNUL"; /* four names of three letters, no pointers */
    if (n == 3u) {
        size_t i;
        for (i = 0; i < 12u; i += 3u) {
            if (upper(p[0]) == (uint8_t)three[i] && upper(p[1]) == (uint8_t)three[i + 1u]
                && upper(p[2]) == (uint8_t)three[i + 2u]) {
                return true;
            }
        }
        return false;
    }
    if (n != 4u && n != 5u) {
        return false;
    }
    if (!((upper(p[0]) == 'C' && upper(p[1]) == 'O' && upper(p[2]) == 'M')
          || (upper(p[0]) == 'L' && upper(p[1]) == 'P' && upper(p[2]) == 'T'))) {
        return false;
    }
    if (n == 4u) {
        return p[3] >= '1' && p[3] <= '9';
    }
    /* superscript one, two, three: U+00B9, U+00B2, U+00B3 in UTF-8 */
    return p[3] == 0xC2u && (p[4] == 0xB9u || p[4] == 0xB2u || p[4] == 0xB3u);
}

idl_name_verdict_t idl_name_check(const uint8_t *name, size_t n, size_t max)
{
    size_t i;
    size_t stem;
    uint32_t cp = 0;
    bool colon = false;
    bool separator = false;
    bool format = false;
    if (n == 0u) {
        return IDL_NAME_EMPTY;
    }
    if (n > max) {
        return IDL_NAME_TOO_LONG;
    }
    for (i = 0; i < n;) {
        size_t k = utf8_next(name + i, n - i, &cp);
        if (k == 0u) {
            return IDL_NAME_NOT_UTF8;
        }
        i += k;
    }
    for (i = 0; i < n;) {
        i += utf8_next(name + i, n - i, &cp);
        if (cp < 0x20u || (cp >= 0x7Fu && cp <= 0x9Fu)) {
            return IDL_NAME_CONTROL_CHAR;
        }
        colon = colon || cp == ':';
        separator = separator || cp == '/' || cp == '\\';
        format = format || is_format(cp);
    }
    if (name[0] == '/' || name[0] == '\\') {
        return IDL_NAME_ABSOLUTE;
    }
    if (colon) { /* "C:" at the start is a drive letter, and so is any other colon */
        return IDL_NAME_DRIVE_LETTER;
    }
    if (separator) {
        return IDL_NAME_PATH_SEPARATOR;
    }
    if ((n == 1u && name[0] == '.') || (n == 2u && name[0] == '.' && name[1] == '.')) {
        return IDL_NAME_DOT_DOT;
    }
    if (format) {
        return IDL_NAME_FORMAT_CHAR;
    }
    for (stem = 0; stem < n && name[stem] != '.'; stem++) {
    }
    while (stem > 0u && name[stem - 1u] == ' ') {
        stem--;
    }
    if (reserved(name, stem)) {
        return IDL_NAME_RESERVED_DEVICE;
    }
    if (name[n - 1u] == '.' || name[n - 1u] == ' ') {
        return IDL_NAME_TRAILING_DOT_SPACE;
    }
    return IDL_NAME_OK;
}
