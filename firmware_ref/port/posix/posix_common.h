/* What the posix device's files share: the program's name in its messages and the one way it
 * refuses (one line on stderr, then exit). */
#ifndef IDL_POSIX_COMMON_H
#define IDL_POSIX_COMMON_H

#include <stdio.h>
#include <stdlib.h>

#define PROG "idemlink-device"

/* One line on stderr ("idemlink-device: WHAT[: DETAIL]"), then exit(code). */
static inline void idl_posix_fail(int code, const char *what, const char *detail)
{
    fprintf(stderr, PROG ": %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    exit(code);
}

#endif /* IDL_POSIX_COMMON_H */
