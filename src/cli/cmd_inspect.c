/* dfl inspect DIR [--json] [--target T] [--check-weights]: checkpoint anatomy. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "dfl/common.h"
#include "dfl/config.h"
#include "dfl/inspect.h"
#include "dfl/safetensors.h"

static const char *usage_text =
    "usage: dfl inspect DIR [--json] [--check-weights]\n"
    "       dfl inspect DRAFTER_DIR --target TARGET_DIR [--json]\n"
    "\n"
    "Identify a checkpoint: layout (text-only, vision-language, drafter) and the tensor prefix\n"
    "that matched, architecture, layer types, heads, dtypes, tensors and bytes per component\n"
    "(text / vision / mtp / other), and every tensor the forward does not read; for a fine-grained\n"
    "FP8 checkpoint (quantization_config) the method, format, block size and the quantized vs\n"
    "unquantized tensors and bytes. Every expected\n"
    "text tensor is checked for presence and shape. With --target, check a drafter against a\n"
    "target and print the effective target_layer_ids; a drafter whose num_target_layers differs\n"
    "from the target's layer count is compatible when the layers it reads exist (warning).\n"
    "A target's report says which drafters the checkpoint itself offers: its MTP head (mtp.*\n"
    "tensors, mtp_num_hidden_layers; --drafter mtp) when present and loadable.\n"
    "\n"
    "  --json           machine-readable output\n"
    "  --target DIR     (drafters) the target model to check compatibility with\n"
    "  --check-weights  scan every tensor the forward reads for NaN/Inf; names each one with\n"
    "                   its count of non-finite values (exit 1 when there are any)\n";

int cmd_inspect(int argc, char **argv) {
    const char *dir = NULL, *target = NULL;
    int json = 0, check = 0;
    st_place_set(ST_PLACE_MAP); /* nothing computes: the weights are read in place */
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            fputs(usage_text, stdout);
            return 0;
        } else if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--check-weights") == 0) {
            check = 1;
        } else if (strcmp(argv[i], "--target") == 0) {
            target = cli_value(argc, argv, &i);
        } else if (argv[i][0] == '-') {
            return cli_usage_error("inspect", "unknown option '%s' (see dfl inspect --help)", argv[i]);
        } else if (!dir) {
            dir = argv[i];
        } else {
            return cli_usage_error("inspect", "unexpected argument '%s'", argv[i]);
        }
    }
    if (!dir) return cli_usage_error("inspect", "missing checkpoint directory (see dfl inspect --help)");
    if (target) { /* a target given to a target is a usage error (exit 2), not a failure */
        dfl_config c;
        if (config_load(&c, dir) != DFL_OK) return cli_fail("inspect", "%s", dfl_errmsg());
        if (c.arch != DFL_ARCH_DFLASH)
            return cli_usage_error("inspect", "--target applies to drafters; %s is a target model", dir);
    }
    int compatible;
    if (model_inspect(stdout, stderr, dir, target, json, check, &compatible) != DFL_OK)
        return cli_fail("inspect", "%s", dfl_errmsg());
    return compatible ? 0 : 1;
}
