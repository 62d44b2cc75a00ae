/* Helpers for the ctypes tests (tests/test_window.py): the struct size and the counters, so
 * Python never has to mirror the C layout. Not part of the firmware API. */
#include <stddef.h>

#include "idl_window.h"

size_t idl_window_shim_sizeof(void);
uint32_t idl_window_shim_counter(const idl_window_t *w, unsigned which);

size_t idl_window_shim_sizeof(void) { return sizeof(idl_window_t); }

uint32_t idl_window_shim_counter(const idl_window_t *w, unsigned which)
{
#if IDL_WINDOW_COUNTERS
    switch (which) {
    case 0u: return IDL_WINDOW_ACCEPTED(w);
    case 1u: return IDL_WINDOW_DUPLICATES(w);
    case 2u: return IDL_WINDOW_TOO_OLD(w);
    case 3u: return IDL_WINDOW_ADVANCES(w);
    default: return 0xFFFFFFFFu;
    }
#else
    (void)w;
    (void)which;
    return 0xFFFFFFFFu;
#endif
}
