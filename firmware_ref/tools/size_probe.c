/* Size probe for `make size`: nm -S reports the size of this object = RAM of one window state. */
#include "idl_window.h"

idl_window_t idl_size_probe_state;
