/*
** ndjson_fuzz: core.stream_parser('ndjson'), one message per line. See
** stream_fuzz.h for the input and the checks; the reference cuts the whole
** buffer at every LF, drops one CR before it, and skips blank lines (spaces,
** tabs, CRs); the last line needs no LF.
*/
#define FZ_KIND "ndjson"
#include "stream_fuzz.h"

static int fz_blank(const char *p, size_t n) {
    size_t i;
    for (i = 0; i < n; i++)
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r') return 0;
    return 1;
}

static void fz_check_event(const fz_event *e, size_t max) {
    if (e->data_len > max) fz_fail("a line of %zu bytes above max %zu", e->data_len, max);
    if (memchr(e->data, '\n', e->data_len) != NULL) fz_fail("a line holds LF");
    if (fz_blank(e->data, e->data_len)) fz_fail("a blank line was given");
    if (e->event != NULL || e->id != NULL || e->end_stream) fz_fail("an ndjson event with other fields");
}

static int fz_reference(const uint8_t *p, size_t n, fz_out *o) {
    size_t at = 0;
    while (at < n) {
        size_t end = at, next;
        fz_event e;
        while (end < n && p[end] != '\n') end++;
        next = end + 1;
        if (end > at && p[end - 1] == '\r') end--;
        if (!fz_blank((const char *)p + at, end - at)) {
            memset(&e, 0, sizeof e);
            e.data = (const char *)p + at;
            e.data_len = end - at;
            fz_put_event(o, &e);
        }
        at = next;
    }
    return 1;
}
