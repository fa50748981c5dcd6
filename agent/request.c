/*
** request.c: request fields, request paths, and environment lists.
*/
#include "agent.h"

/* {======================================================
** Request fields
** =======================================================*/

/* Missing fields give def; a field of the wrong type is refused. Return 0 or -1. */
int field_bytes(const wire_msg *m, const char *key, const unsigned char **p, size_t *len) {
    const wire_field *f = wire_find(m, key);
    if (f == NULL) return 0;
    if (f->type != WIRE_BYTES) return -1;
    *p = f->val;
    *len = f->len;
    return 0;
}

int field_int(const wire_msg *m, const char *key, int64_t *v, int64_t lo, int64_t hi) {
    const wire_field *f = wire_find(m, key);
    int64_t x;
    if (f == NULL) return 0;
    if (f->type != WIRE_INT) return -1;
    x = wire_get_i64(f->val);
    if (x < lo || x > hi) return -1;
    *v = x;
    return 0;
}

int field_bool(const wire_msg *m, const char *key, int *v) {
    const wire_field *f = wire_find(m, key);
    if (f == NULL) return 0;
    if (f->type != WIRE_BOOL) return -1;
    *v = f->val[0];
    return 0;
}

/* A NUL-free copy of bytes, or NULL (no memory, or a NUL inside). */
char *dup_cstr(const unsigned char *p, size_t len) {
    char *s;
    if (memchr(p, '\0', len) != NULL) return NULL;
    s = (char *)malloc(len + 1);
    if (s == NULL) return NULL;
    memcpy(s, p, len);
    s[len] = '\0';
    return s;
}

/*
** A request path as a C string: relative paths are relative to the workdir,
** "" is the workdir itself. Returns NULL with *err set: EINVAL for a NUL
** inside, ENAMETOOLONG, ENOMEM.
*/
char *request_path(const unsigned char *p, size_t len, int *err) {
    size_t wl = strlen(workdir);
    char *s;
    if (memchr(p, '\0', len) != NULL) { *err = EINVAL; return NULL; }
    if (len > 0 && p[0] == '/') {
        if (len >= PATH_MAX) { *err = ENAMETOOLONG; return NULL; }
        s = dup_cstr(p, len);
    } else {
        if (wl + 1 + len >= PATH_MAX) { *err = ENAMETOOLONG; return NULL; }
        s = (char *)malloc(wl + len + 2);
        if (s != NULL) {
            memcpy(s, workdir, wl);
            s[wl] = '/';
            memcpy(s + wl + 1, p, len);
            s[wl + 1 + len] = '\0';
        }
    }
    if (s == NULL) *err = ENOMEM;
    return s;
}

/* The "path" field, resolved; on failure the reply is sent and NULL returned. */
char *path_field(conn *c, const wire_msg *m) {
    const wire_field *f = wire_find(m, "path");
    char *s;
    int e = 0;
    if (f == NULL || f->type != WIRE_BYTES) {
        reply_error(c, m->id, "invalid", "field 'path' is missing or not bytes");
        return NULL;
    }
    s = request_path(f->val, f->len, &e);
    if (s == NULL) {
        if (e == EINVAL) reply_error(c, m->id, "invalid", "field 'path' contains a NUL byte");
        else reply_errno(c, m->id, e, "path");
    }
    return s;
}

/* {------------------------------------------------------
** Environments: a list of "NAME=value" where a later name replaces an earlier one
** -------------------------------------------------------*/

void env_free(envlist *e) {
    size_t i;
    for (i = 0; i < e->n; i++) free(e->v[i]);
    free(e->v);
    e->v = NULL;
    e->n = e->cap = 0;
}

/* Adds (takes) s; returns 0 or -1 when out of memory (s is freed then). */
static int env_put(envlist *e, char *s) {
    size_t i, nl = (size_t)(strchr(s, '=') - s);
    for (i = 0; i < e->n; i++)
        if (strncmp(e->v[i], s, nl + 1) == 0) { free(e->v[i]); e->v[i] = s; return 0; }
    if (e->n + 2 > e->cap) {
        size_t nc = e->cap ? e->cap * 2 : 16;
        char **nv = (char **)realloc(e->v, nc * sizeof *nv);
        if (nv == NULL) { free(s); return -1; }
        e->v = nv;
        e->cap = nc;
    }
    e->v[e->n++] = s;
    e->v[e->n] = NULL;
    return 0;
}

int env_put_str(envlist *e, const char *s) {
    char *d = strdup(s);
    if (d == NULL) return -1;
    return env_put(e, d);
}

/*
** Adds the pairs of a WIRE_MAP field. Returns 0, -1 when a name or value
** is not valid (empty name, '=' in a name, NUL anywhere), -2 out of memory.
** The tag variable cannot be set this way.
*/
int env_put_map(envlist *e, const wire_field *f) {
    size_t off = 0, kl, vl;
    const unsigned char *k, *v;
    while (wire_next_item(f, &off, &k, &kl)) {
        char *s;
        if (!wire_next_item(f, &off, &v, &vl)) return -1;
        if (kl == 0 || memchr(k, '=', kl) != NULL || memchr(k, '\0', kl) != NULL ||
            memchr(v, '\0', vl) != NULL)
            return -1;
        if (kl == sizeof TAG_VAR - 1 && memcmp(k, TAG_VAR, kl) == 0) continue;
        s = (char *)malloc(kl + vl + 2);
        if (s == NULL) return -2;
        memcpy(s, k, kl);
        s[kl] = '=';
        memcpy(s + kl + 1, v, vl);
        s[kl + 1 + vl] = '\0';
        if (env_put(e, s) != 0) return -2;
    }
    return 0;
}

/* }------------------------------------------------------ */

/* }====================================================== */
