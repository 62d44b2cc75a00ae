/* Size probe for `make size`: nm -S reports the size of these objects = RAM of one window state
 * and of one set of (optional) diagnostic counters. */
#include "idl_window.h"

idl_window_t idl_size_probe_state;
idl_window_counters_t idl_size_probe_counters;

/* What counting costs at a call site (an upper bound: this includes the return and the literal
 * holding the counters' address). */
void idl_size_probe_count(idl_verdict_t v);
void idl_size_probe_count(idl_verdict_t v) { IDL_WINDOW_COUNT(&idl_size_probe_counters, v); }
