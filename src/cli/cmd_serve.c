/* dfl serve: run the HTTP server (src/server) until SIGTERM or SIGINT, then drain and exit 0. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "dfl/ddtree.h"
#include "dfl/common.h"
#include "dfl/drafter.h"
#include "dfl/server.h"
#include "dfl/spec.h"
#include "dfl/tokenizer.h"

static const char *usage_text =
    "usage: dfl serve --target DIR [--drafter DIR|mtp|DIR:mtp [--block-size B] [--tree-budget N] [--block-attn MODE]]\n"
    "                 [--host ADDR] [--port P]\n"
    "                 [--max-queue N] [--max-context N] [--max-body BYTES] [--tokenizer PATH]\n"
    "                 [--timeout S] [--max-connections N] [--max-connections-per-client N]\n"
    "                 [--model-name NAME] [--quiet] [--check-weights] [--device cpu|cuda]\n"
    "                 [--weights auto|copy|map]\n"
    "\n"
    "Serve generation over HTTP with DFlash speculative decoding (or autoregressively without a\n"
    "drafter): OpenAI POST /v1/completions and /v1/chat/completions (streaming with \"stream\": true;\n"
    "logprobs, and echo for lm-eval's loglikelihood requests), SGLang POST /generate (meta_info\n"
    "carries spec_verify_ct, spec_accept_length and per-position acceptance), POST /tokenize,\n"
    "POST /detokenize, GET /v1/models, GET /health and Prometheus\n"
    "GET /metrics (vllm:spec_decode_* counters). One sequence at a time: requests queue and are\n"
    "served in arrival order by one worker (no batching); each request gives the same tokens as\n"
    "dfl generate with the same prompt and options. See docs/serve.md.\n"
    "\n"
    "  --target DIR        target checkpoint (qwen3, qwen3_5 or qwen3_5_text)\n"
    "  --drafter DIR       DFlash drafter checkpoint (z-lab format); 'mtp' = the target's own MTP head,\n"
    "                      'DIR:mtp' = the MTP head of checkpoint DIR\n"
    "  --block-size B      verification block (default: the drafter's block_size; the MTP head: 4 =\n"
    "                      3 autoregressive steps)\n"
    "  --tree-budget N     verify with DDTree of N draft nodes (0 = chain, default); greedy requests\n"
    "                      only (temperature 0), others get 400\n" CLI_BLOCK_ATTN_HELP
    "  --host ADDR         address to bind (default 127.0.0.1, loopback only)\n"
    "  --port P            TCP port (default 8000; 0 = a free port, printed at start)\n"
    "  --max-queue N       requests that may wait behind the running one; more get 503 (default 64)\n"
    "  --max-context N     positions per request, prompt + output (default min(4096,\n"
    "                      max_position_embeddings)); longer requests get 400\n"
    "  --max-body BYTES    request body limit; larger bodies get 413 (default 8388608)\n"
    "  --timeout S         close a connection silent for S seconds while it sends its request or\n"
    "                      should read its answer (never while its request waits or runs), or\n"
    "                      whose request has not arrived whole S seconds after it began (plus 1 s\n"
    "                      per 64 KiB of body); cancel a stream whose client reads nothing for S\n"
    "                      seconds (default 60; 0 = never)\n"
    "  --max-connections N open connections in all (default 4096; an idle one costs a descriptor and\n"
    "                      a little memory, not a thread); more are closed at once; the last N/8\n"
    "                      only for addresses that hold none. The open-file limit is raised to\n"
    "                      N + 64, or N lowered to fit the hard limit, with a warning\n"
    "  --max-connections-per-client N\n"
    "                      open connections from one client address (default 64, at most N)\n"
    "  --tokenizer PATH    tokenizer.json or directory (default: the target directory)\n"
    "  --model-name NAME   the \"model\" reported in responses (default: the target directory's name)\n"
    "  --quiet             do not log each request on stderr\n"
    "  --check-weights     scan the weights for NaN/Inf at load\n"
    "  --device D          cpu (default) | cuda: where the target's forwards run (the drafter stays on\n"
    "                      the CPU; the devices this build has: dfl --version; /v1/models names it)\n" CLI_WEIGHTS_HELP
    "\n"
    "Prints \"dfl serve: listening on http://HOST:PORT\" on stderr once it accepts requests (after a\n"
    "line naming a DFlash drafter's block attention).\n";

int cmd_serve(int argc, char **argv) {
    dfl_server_opts o;
    server_opts_default(&o);
    o.port = 8000;
    o.log_requests = 1;
    long v;
    int block_attn = DFL_BLOCK_ATTN_AUTO;
    int per_client_given = 0; /* the default per-client cap follows a smaller --max-connections */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        dfl_device dev;
        const int dev_rc = cli_device_option("serve", argc, argv, &i, &dev);
        if (dev_rc < 0) return 2;
        if (dev_rc > 0) {
            o.device = (int)dev;
            continue;
        }
        const int attn_rc = cli_block_attn_option("serve", argc, argv, &i, &block_attn);
        if (attn_rc < 0) return 2;
        if (attn_rc > 0) continue;
        if (cli_is_help(a)) {
            fputs(usage_text, stdout);
            return 0;
        } else if (strcmp(a, "--target") == 0) {
            o.target = cli_value(argc, argv, &i);
        } else if (strcmp(a, "--drafter") == 0) {
            o.drafter = cli_value(argc, argv, &i);
        } else if (strcmp(a, "--tokenizer") == 0) {
            o.tokenizer = cli_value(argc, argv, &i);
        } else if (strcmp(a, "--model-name") == 0) {
            o.model_name = cli_value(argc, argv, &i);
        } else if (strcmp(a, "--host") == 0) {
            o.host = cli_value(argc, argv, &i);
        } else if (strcmp(a, "--tree-budget") == 0) {
            if (cli_parse_long("serve", a, cli_value(argc, argv, &i), 0, DDTREE_MAX_BUDGET, &v)) return 2;
            o.tree_budget = (int)v;
        } else if (strcmp(a, "--block-size") == 0) {
            if (cli_parse_long("serve", a, cli_value(argc, argv, &i), 2, DFL_MAX_BLOCK, &v)) return 2;
            o.block = (int)v;
        } else if (strcmp(a, "--port") == 0) {
            if (cli_parse_long("serve", a, cli_value(argc, argv, &i), 0, 65535, &v)) return 2;
            o.port = (int)v;
        } else if (strcmp(a, "--max-queue") == 0) {
            if (cli_parse_long("serve", a, cli_value(argc, argv, &i), 0, 1 << 20, &v)) return 2;
            o.max_queue = (int)v;
        } else if (strcmp(a, "--max-context") == 0) {
            if (cli_parse_long("serve", a, cli_value(argc, argv, &i), 2, 1 << 24, &v)) return 2;
            o.max_context = (int)v;
        } else if (strcmp(a, "--max-body") == 0) {
            if (cli_parse_long("serve", a, cli_value(argc, argv, &i), 1, 1L << 32, &v)) return 2;
            o.max_body = (size_t)v;
        } else if (strcmp(a, "--timeout") == 0) {
            if (cli_parse_long("serve", a, cli_value(argc, argv, &i), 0, 86400, &v)) return 2;
            o.timeout_s = (int)v;
        } else if (strcmp(a, "--max-connections") == 0) {
            if (cli_parse_long("serve", a, cli_value(argc, argv, &i), 1, 65536, &v)) return 2;
            o.max_conns = (int)v;
        } else if (strcmp(a, "--max-connections-per-client") == 0) {
            if (cli_parse_long("serve", a, cli_value(argc, argv, &i), 1, 65536, &v)) return 2;
            o.max_conns_per_client = (int)v;
            per_client_given = 1;
        } else if (strcmp(a, "--quiet") == 0) {
            o.log_requests = 0;
        } else if (strcmp(a, "--check-weights") == 0) {
            o.check_weights = 1;
        } else {
            return cli_usage_error("serve", "unknown argument '%s' (see dfl serve --help)", a);
        }
    }
    if (!o.target) return cli_usage_error("serve", "missing --target DIR");
    if (tok_locate(o.tokenizer, o.target, "serving text needs") != DFL_OK) return cli_fail("serve", "%s", dfl_errmsg());
    if (o.block && !o.drafter) return cli_usage_error("serve", "--block-size needs --drafter");
    if (o.tree_budget && !o.drafter) return cli_usage_error("serve", "--tree-budget needs --drafter");
    if (block_attn != DFL_BLOCK_ATTN_AUTO && !o.drafter)
        return cli_usage_error("serve", "--block-attn needs --drafter");
    o.block_attn = drafter_causal_name(block_attn);
    if (!per_client_given && o.max_conns_per_client > o.max_conns) o.max_conns_per_client = o.max_conns;
    if (o.max_conns_per_client > o.max_conns)
        return cli_usage_error("serve", "--max-connections-per-client %d exceeds --max-connections %d",
                               o.max_conns_per_client, o.max_conns);
    /* Block the signals in every thread (the server's threads inherit this mask) and take them
     * synchronously here, so that shutdown runs in ordinary code, not in a handler. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    dfl_server *srv = server_start(&o);
    if (!srv) return cli_fail("serve", "%s", dfl_errmsg());
    if (*server_drafter_warning(srv)) fprintf(stderr, "dfl serve: warning: %s\n", server_drafter_warning(srv));
    if (*server_drafter_attn(srv))
        fprintf(stderr, "dfl serve: drafter block attention: %s\n", server_drafter_attn(srv));
    const char *host = o.host ? o.host : "127.0.0.1";
    const int v6 = strchr(host, ':') != NULL;
    fprintf(stderr, "dfl serve: listening on http://%s%s%s:%d (target %s%s%s%s%s, context %d, queue %d)\n",
            v6 ? "[" : "", host, v6 ? "]" : "", server_port(srv), o.target, o.device ? " on " : "",
            o.device ? dfl_device_name((dfl_device)o.device) : "", o.drafter ? ", drafter " : "",
            o.drafter ? o.drafter : "", server_max_context(srv), o.max_queue);
    fflush(stderr);
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "dfl serve: %s, draining\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    server_stop(srv);
    fprintf(stderr, "dfl serve: stopped\n");
    return 0;
}
