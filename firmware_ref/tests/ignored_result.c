/* Must NOT compile under `make check` (-Werror): a call that drops a result the API marks
 * IDL_CHECKRETURN. The Makefile compiles it and fails if it compiles. */
#include "idl_crc32c.h"

void idl_ignored_result(const uint8_t *data, size_t n);

void idl_ignored_result(const uint8_t *data, size_t n)
{
    idl_crc32c(data, n);
}
