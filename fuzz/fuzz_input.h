/*
** fuzz_input.h: reading a libFuzzer input as a stream of choices, shared by
** the targets that build structured values from it (json_encode, chan, list,
** wire, http). `next` takes one byte (-1 at the end), `take` up to `want`
** bytes (fewer at the end of the input).
*/
#ifndef MAYURA_FUZZ_INPUT_H
#define MAYURA_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>

typedef struct { const uint8_t *p; size_t n; } input;

static __attribute__((unused)) int next(input *in) {
    if (in->n == 0) return -1;
    in->n--;
    return *in->p++;
}

/* Up to want bytes; returns how many (the rest of the input when shorter). */
static __attribute__((unused)) size_t take(input *in, size_t want, const uint8_t **out) {
    if (want > in->n) want = in->n;
    *out = in->p;
    in->p += want;
    in->n -= want;
    return want;
}

#endif
