/*
** eventstream_fuzz: core.stream_parser('eventstream'), AWS event-stream
** messages (12-byte prelude with its CRC-32, headers, payload, message
** CRC-32). See stream_fuzz.h for the input and the checks. When bit 2 of the
** first byte is set, fz_prepare first writes the right CRCs into every
** message it can frame, so that the fuzzer reaches the headers and payloads;
** otherwise the CRCs are as given (and mostly wrong). The reference reads
** the whole buffer with a bit-by-bit CRC of its own.
*/
#define FZ_KIND "eventstream"
#define FZ_PREPARE
#include <stddef.h>
#include <stdint.h>
static void fz_prepare(uint8_t *p, size_t n);
#include "stream_fuzz.h"

static uint32_t fz_crc(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    size_t i;
    int k;
    for (i = 0; i < n; i++) {
        c ^= p[i];
        for (k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
    }
    return ~c;
}

static uint32_t fz_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static void fz_put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static void fz_prepare(uint8_t *p, size_t n) {
    size_t at = 2;
    if (n < 2 || !(p[0] & 4)) return;
    while (n - at >= 12) {
        size_t total = fz_be32(p + at);
        fz_put_be32(p + at + 8, fz_crc(p + at, 8));
        if (total < 16 || total > n - at) return;
        fz_put_be32(p + at + total - 4, fz_crc(p + at, total - 4));
        at += total;
    }
}

static void fz_check_event(const fz_event *e, size_t max) {
    if (e->data_len > max) fz_fail("a payload of %zu bytes above max %zu", e->data_len, max);
    if (e->id != NULL) fz_fail("an eventstream event with an id");
}

/* The headers of one message: whether they are well formed; the event name when one is set. */
static int fz_headers(const uint8_t *h, size_t n, fz_event *e) {
    static const uint8_t fixed[10] = { 0, 0, 1, 2, 4, 8, 0, 0, 8, 16 };
    static const char *names[2048];
    static size_t lens[2048];
    size_t count = 0, at = 0, i;
    const char *kinds[3] = { NULL, NULL, NULL };
    size_t kind_len[3] = { 0, 0, 0 };
    while (at < n) {
        size_t nl = h[at], vl;
        uint8_t type;
        if (nl == 0 || at + 1 + nl + 1 > n) return 0;
        type = h[at + 1 + nl];
        if (type > 9) return 0;
        for (i = 0; i < count; i++)
            if (lens[i] == nl && memcmp(names[i], h + at + 1, nl) == 0) return 0;
        if (count == 2048) fz_fail("more headers than the reference holds");
        names[count] = (const char *)h + at + 1;
        lens[count] = nl;
        count++;
        {
            size_t v = at + 2 + nl;
            if (type == 6 || type == 7) {
                if (v + 2 > n) return 0;
                vl = ((size_t)h[v] << 8) | h[v + 1];
                v += 2;
            } else {
                vl = fixed[type];
            }
            if (v + vl > n) return 0;
            if (type == 6 || type == 7) { /* the module gives both as strings */
                static const char *const want[3] = { ":event-type", ":exception-type", ":error-code" };
                int k;
                for (k = 0; k < 3; k++)
                    if (nl == strlen(want[k]) && memcmp(h + at + 1, want[k], nl) == 0) {
                        kinds[k] = (const char *)h + v;
                        kind_len[k] = vl;
                    }
            }
            at = v + vl;
        }
    }
    for (i = 0; i < 3; i++)
        if (kinds[i] != NULL) {
            e->event = kinds[i];
            e->event_len = kind_len[i];
            break;
        }
    return 1;
}

static int fz_reference(const uint8_t *p, size_t n, fz_out *o) {
    size_t at = 0;
    while (at < n) {
        size_t total, hl;
        fz_event e;
        if (n - at < 12) return 0;
        total = fz_be32(p + at);
        hl = fz_be32(p + at + 4);
        if (fz_crc(p + at, 8) != fz_be32(p + at + 8)) return 0;
        if (total < 16 || hl > total - 16 || hl > 128 * 1024) return 0;
        if (total > n - at) return 0;
        if (fz_crc(p + at, total - 4) != fz_be32(p + at + total - 4)) return 0;
        memset(&e, 0, sizeof e);
        if (!fz_headers(p + at + 12, hl, &e)) return 0;
        e.data = (const char *)p + at + 12 + hl;
        e.data_len = total - 16 - hl;
        fz_put_event(o, &e);
        at += total;
    }
    return 1;
}
