/* Size probe for `make size-device`: nm -S reports the size of this object = the RAM of one
 * device (session with its window, replay cache, decoder and TX buffers, plus the registers). */
#include "idl_port.h"

idl_device_t idl_size_probe_device;
