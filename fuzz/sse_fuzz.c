/*
** sse_fuzz: core.stream_parser('sse'), server-sent events. See
** stream_fuzz.h for the input and the checks; the reference applies the
** WHATWG event-stream rules to the whole buffer: cut it into lines (CRLF,
** LF or CR), drop a leading BOM and the last line when it has no end, then
** read the fields and dispatch at each blank line.
*/
#define FZ_KIND "sse"
#include "stream_fuzz.h"

static void fz_check_event(const fz_event *e, size_t max) {
    if (e->data_len > max) fz_fail("data of %zu bytes above max %zu", e->data_len, max);
    if (memchr(e->data, '\r', e->data_len) != NULL) fz_fail("data holds CR");
    if (e->event == NULL || e->id == NULL) fz_fail("an event without its type or id");
    if (e->event_len == 0) fz_fail("an empty event type");
    if (memchr(e->event, '\r', e->event_len) || memchr(e->event, '\n', e->event_len)) fz_fail("a type holds a line end");
    if (memchr(e->id, '\r', e->id_len) || memchr(e->id, '\n', e->id_len) || memchr(e->id, '\0', e->id_len))
        fz_fail("an id holds a line end or NUL");
    if (e->end_stream) fz_fail("an sse event that ends the stream");
}

typedef struct {
    fz_out data, type, id;
    int data_lines;
} fz_sse;

static int fz_field_is(const uint8_t *p, size_t n, const char *name) {
    return n == strlen(name) && memcmp(p, name, n) == 0;
}

static void fz_sse_line(fz_sse *s, const uint8_t *p, size_t n, fz_out *o) {
    size_t f = 0, v;
    if (n == 0) {
        if (s->data_lines > 0) {
            fz_event e;
            memset(&e, 0, sizeof e);
            e.data = s->data.p ? s->data.p : "";
            e.data_len = s->data.len;
            e.event = s->type.len ? s->type.p : "message";
            e.event_len = s->type.len ? s->type.len : 7;
            e.id = s->id.p ? s->id.p : "";
            e.id_len = s->id.len;
            fz_put_event(o, &e);
        }
        s->data.len = 0;
        s->type.len = 0;
        s->data_lines = 0;
        return;
    }
    if (p[0] == ':') return;
    while (f < n && p[f] != ':') f++;
    v = f < n ? f + 1 : n;
    if (v < n && p[v] == ' ') v++;
    if (fz_field_is(p, f, "data")) {
        if (s->data_lines > 0) fz_put(&s->data, "\n", 1);
        fz_put(&s->data, p + v, n - v);
        s->data_lines++;
    } else if (fz_field_is(p, f, "event")) {
        s->type.len = 0;
        fz_put(&s->type, p + v, n - v);
    } else if (fz_field_is(p, f, "id") && memchr(p + v, 0, n - v) == NULL) {
        s->id.len = 0;
        fz_put(&s->id, p + v, n - v);
    }
}

static int fz_reference(const uint8_t *p, size_t n, fz_out *o) {
    fz_sse s;
    size_t at = 0;
    memset(&s, 0, sizeof s);
    if (n >= 3 && p[0] == 0xEF && p[1] == 0xBB && p[2] == 0xBF) at = 3;
    for (;;) {
        size_t end = at;
        while (end < n && p[end] != '\r' && p[end] != '\n') end++;
        if (end == n) break; /* no line end: not a line */
        fz_sse_line(&s, p + at, end - at, o);
        at = end + ((p[end] == '\r' && end + 1 < n && p[end + 1] == '\n') ? 2 : 1);
    }
    mc_buf_free(&s.data);
    mc_buf_free(&s.type);
    mc_buf_free(&s.id);
    return 1;
}
