/* Checkpoint anatomy (dfl inspect, the Python API's inspect): layout, architecture, layer types,
 * dtypes, tensors per component, unused tensors, quantization, MTP head; for a drafter its
 * target layers and, given a target, the compatibility check. */
#ifndef DFL_INSPECT_H
#define DFL_INSPECT_H

#include <stdio.h>

/* Write the report on dir to f: one JSON object and a newline (json) or the text report.
 * target: only for a drafter, the target to check it against (*compatible says the verdict;
 * 1 when no target is given); warnings go to log (NULL: none). check: scan every tensor the
 * forward reads for NaN/Inf (an error naming them). DFL_ERR with the message on failure. */
int model_inspect(FILE *f, FILE *log, const char *dir, const char *target, int json, int check, int *compatible);

#endif
