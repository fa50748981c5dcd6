/*
** connect_fuzz: core.stream_parser('connect'), Connect streaming envelopes
** (1 flag byte, 4-byte big-endian length, message; flag 0x02 ends the
** stream). See stream_fuzz.h for the input and the checks; the reference
** reads the envelopes off the whole buffer: a stream is valid when every
** envelope is whole, carries no flag but 0x02, and the 0x02 one is last.
*/
#define FZ_KIND "connect"
#include "stream_fuzz.h"

static void fz_check_event(const fz_event *e, size_t max) {
    if (e->data_len > max) fz_fail("a message of %zu bytes above max %zu", e->data_len, max);
    if (e->event != NULL || e->id != NULL) fz_fail("a connect event with SSE fields");
}

static int fz_reference(const uint8_t *p, size_t n, fz_out *o) {
    size_t at = 0;
    while (n - at >= 5) {
        uint8_t flags = p[at];
        size_t len = ((size_t)p[at + 1] << 24) | ((size_t)p[at + 2] << 16) | ((size_t)p[at + 3] << 8) | p[at + 4];
        fz_event e;
        if ((flags & ~2) != 0) return 0;
        if (len > n - at - 5) return 0;
        memset(&e, 0, sizeof e);
        e.data = (const char *)p + at + 5;
        e.data_len = len;
        e.end_stream = (flags & 2) != 0;
        fz_put_event(o, &e);
        at += 5 + len;
        if (flags & 2) return at == n;
    }
    return 0; /* cut inside an envelope, or no end-of-stream envelope */
}
