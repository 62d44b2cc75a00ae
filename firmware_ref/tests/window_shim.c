/* Helpers for the ctypes tests (tests/test_window.py): the struct size, so Python never has to
 * mirror the C layout. Not part of the firmware API. */
#include <stddef.h>

#include "idl_window.h"

size_t idl_window_shim_sizeof(void);

size_t idl_window_shim_sizeof(void) { return sizeof(idl_window_t); }

/* idl_window_commit_counted is static inline: give ctypes an addressable copy. */
idl_verdict_t idl_window_shim_commit_counted(idl_window_t *w, idl_window_counters_t *c,
                                             uint32_t seq);

idl_verdict_t idl_window_shim_commit_counted(idl_window_t *w, idl_window_counters_t *c,
                                             uint32_t seq)
{
    return idl_window_commit_counted(w, c, seq);
}
