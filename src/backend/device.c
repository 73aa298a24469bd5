/* Device names: apart from the backends, so that code which only records a device (eval results,
 * the fuzz harnesses) links without them. */
#include "dfl/backend.h"

static const char *const device_names[DFL_DEVICE_COUNT] = {"cpu", "cuda"};

const char *dfl_device_name(dfl_device d) { return d >= 0 && d < DFL_DEVICE_COUNT ? device_names[d] : "?"; }
