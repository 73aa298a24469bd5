/* The prompts and the conversation text of each turn, and --dump-prompts. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/prompt.h"
#include "eval/run.h"

/* ChatML: the templated first turn, the assistant's content and its end, the templated second turn. */
static char *chatml_two_turns(char *first, const char *content, char *second) {
    const size_t n = strlen(first) + strlen(content) + strlen(second) + 32;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s%s<|im_end|>\n%s", first, content, second);
    free(first);
    free(second);
    return s;
}

/* The conversation text for a turn: turn 1 alone, or turn 1 + the model's answer + turn 2. */
char *er_turn_text(const eval_prompt *p, int turn, const char *answer1, dfl_chat chat) {
    if (turn == 1 && chat == DFL_CHAT_CHATML_NOTHINK) {
        /* Qwen3's chat template (enable_thinking false) renders an assistant message before the last
         * user message as '<|im_start|>assistant\n' + content + '<|im_end|>\n' with no think block,
         * content being what follows its last '</think>' with leading newlines stripped (when it has
         * one); only the generation prompt gets the empty '<think>\n\n</think>\n\n'. */
        const char *content = answer1, *e;
        while ((e = strstr(content, "</think>"))) content = e + strlen("</think>");
        if (content != answer1)
            while (*content == '\n') content++;
        return chatml_two_turns(prompt_format(p->turns[0], DFL_CHAT_CHATML), content, prompt_format(p->turns[1], chat));
    }
    char *first = prompt_format(p->turns[0], chat);
    if (turn == 0 || chat == DFL_CHAT_NONE) {
        if (turn == 0) return first;
        /* no template: the raw texts one after another */
        size_t n = strlen(first) + strlen(answer1) + strlen(p->turns[1]) + 4;
        char *s = malloc(n);
        snprintf(s, n, "%s%s\n%s", first, answer1, p->turns[1]);
        free(first);
        return s;
    }
    return chatml_two_turns(first, answer1, prompt_format(p->turns[1], chat));
}

/* The prompt set: a prompt file (its --format, or sniffed), or z-lab's selection with --protocol zlab. */
int er_load_prompts(eval_prompts *ps, const eval_opts *o, int *zlab_dataset) {
    if (o->protocol == EVAL_PROTOCOL_ZLAB) return eval_zlab_load(ps, o, zlab_dataset);
    const eval_format fmt = o->have_fmt ? o->fmt : eval_format_sniff(o->prompts);
    return eval_prompts_load(ps, o->prompts, fmt, o->field, o->limit, o->keep_going);
}

/* One --dump-prompts line: the prompt of a turn as dfl tokenizes it. */
int er_dump_prompt(FILE *f, const char *path, int index, const eval_prompt *p, int turn, const char *answer1,
                   const char *text, const int32_t *ids, size_t n) {
    fprintf(f, "{\"index\": %d, \"prompt_id\": ", index);
    dfl_json_write_string(f, p->id);
    fprintf(f, ", \"line\": %d, \"turn\": %d", p->line, turn);
    fprintf(f, ", \"user\": "); /* the user message(s), formatted */
    dfl_json_write_string(f, p->turns[0]);
    if (turn) {
        fprintf(f, ", \"answer\": "); /* the assistant message the second turn is built on */
        dfl_json_write_string(f, answer1);
        fprintf(f, ", \"user_2\": ");
        dfl_json_write_string(f, p->turns[1]);
    }
    fprintf(f, ", \"text\": ");
    dfl_json_write_string(f, text);
    fprintf(f, ", \"ids\": [");
    for (size_t i = 0; i < n; i++) fprintf(f, "%s%d", i ? ", " : "", ids[i]);
    fprintf(f, "]}\n");
    return fflush(f) == 0 ? DFL_OK : dfl_seterr("%s: write error: %s", path, strerror(errno));
}

int eval_dump_prompts(const eval_opts *o) {
    if (!o->prompts || !o->dump_prompts) return dfl_seterr("--dump-prompts needs --prompts");
    if (!o->tokenizer && !o->target) return dfl_seterr("--dump-prompts needs --tokenizer (or --target)");
    if (o->protocol == EVAL_PROTOCOL_ZLAB && o->chat != DFL_CHAT_CHATML_NOTHINK)
        return dfl_seterr("--protocol zlab uses Qwen3's template with thinking off (--chat chatml-nothink)");
    eval_prompts ps;
    int d = -1;
    if (tok_locate(o->tokenizer, o->target, "the prompts need")) return DFL_ERR;
    if (er_load_prompts(&ps, o, &d)) return DFL_ERR;
    dfl_tokenizer *tok = tok_open(o->tokenizer ? o->tokenizer : o->target);
    FILE *f = tok ? fopen(o->dump_prompts, "w") : NULL;
    int rc = tok ? DFL_OK : DFL_ERR;
    if (tok && !f) rc = dfl_seterr("%s: cannot create: %s", o->dump_prompts, strerror(errno));
    for (int i = 0; i < ps.n && rc == DFL_OK; i++) {
        if (i % o->shard_n != o->shard_i) continue;
        const eval_prompt *p = &ps.p[i];
        const int turns = o->first_turn || !o->dump_answer ? 1 : p->n_turns;
        for (int turn = 0; turn < turns && rc == DFL_OK; turn++) {
            char *txt = er_turn_text(p, turn, o->dump_answer ? o->dump_answer : "", (dfl_chat)o->chat);
            int32_t *ids = NULL;
            size_t n = 0;
            rc = txt ? tok_encode(tok, txt, strlen(txt), &ids, &n) : dfl_seterr("out of memory");
            if (rc == DFL_OK) rc = er_dump_prompt(f, o->dump_prompts, i, p, turn, o->dump_answer, txt, ids, n);
            else dfl_preperr("prompt %s", p->id);
            free(ids);
            free(txt);
        }
    }
    if (f && fclose(f) != 0 && rc == DFL_OK) rc = dfl_seterr("%s: write error: %s", o->dump_prompts, strerror(errno));
    if (tok) tok_close(tok);
    eval_prompts_free(&ps);
    return rc;
}
