/*
** wire_fuzz: core/wire.h alone, as both ends use it.
**
** Parsing: the input is a frame body (id and fields). When wire_parse takes
** it, every field lies inside the input, has a valid type and length,
** wire_next_item walks every list and map to exactly its end (maps in
** pairs), wire_find finds the first field of each key, and writing the
** fields back gives the input byte for byte: once raw, and once through
** the builder (wire_add_*, wire_open_list / wire_item / wire_close_list)
** when the keys are C strings.
**
** Building: the input is also read as a program for the builder (keys,
** types, items); whatever the builder finishes, wire_parse must take and
** give back the same fields.
*/
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../core/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what) __attribute__((noreturn));
static void fail(const char *what) {
    fprintf(stderr, "\n*** fuzz invariant broken: %s\n", what);
    fflush(stderr);
    abort();
}

static int inside(const void *p, size_t n, const uint8_t *base, size_t size) {
    const uint8_t *q = (const uint8_t *)p;
    return q >= base && q <= base + size && n <= (size_t)(base + size - q);
}

/* The items of a list or map field, walked: returns their count, checks they end at f->len. */
static size_t walk(const wire_field *f) {
    size_t off = 0, len, count = 0, prev = 0;
    const unsigned char *item;
    while (wire_next_item(f, &off, &item, &len)) {
        if (off < prev + 4) fail("wire_next_item did not move on");
        if (item < f->val || item + len > f->val + f->len) fail("an item lies outside its field");
        prev = off;
        count++;
    }
    if (off != f->len) fail("wire_next_item stopped before the end of a checked field");
    return count;
}

/* Writes msg back: the builder when keys have no NUL, else raw bytes. */
static void rebuild(const wire_msg *m, wire_buf *b, int raw) {
    int i;
    wire_begin(b, m->id);
    for (i = 0; i < m->nfields; i++) {
        const wire_field *f = &m->fields[i];
        char key[WIRE_MAX_KEY + 1];
        size_t off = 0, len, at;
        const unsigned char *item;
        if (raw) {
            unsigned char c = (unsigned char)f->key_len;
            wire_raw(b, &c, 1);
            wire_raw(b, f->key, f->key_len);
            c = (unsigned char)f->type;
            wire_raw(b, &c, 1);
            wire_u32(b, (uint32_t)f->len);
            wire_raw(b, f->val, f->len);
            continue;
        }
        memcpy(key, f->key, f->key_len);
        key[f->key_len] = '\0';
        switch (f->type) {
        case WIRE_BYTES: wire_add_bytes(b, key, f->val, f->len); break;
        case WIRE_INT: wire_add_int(b, key, wire_get_i64(f->val)); break;
        case WIRE_BOOL: wire_add_bool(b, key, f->val[0]); break;
        case WIRE_INTS:
            at = wire_open_list(b, key, WIRE_INTS);
            for (off = 0; off < f->len; off += 8) wire_int_item(b, wire_get_i64(f->val + off));
            wire_close_list(b, at);
            break;
        default:
            at = wire_open_list(b, key, f->type);
            while (wire_next_item(f, &off, &item, &len)) wire_item(b, item, len);
            wire_close_list(b, at);
            break;
        }
    }
}

static void check_parse(const uint8_t *data, size_t size) {
    wire_msg m;
    wire_buf b = {0};
    int i, raw, nul_keys = 0;
    if (wire_parse(data, size, &m) != 0) return;
    if (m.id != wire_get_u32(data)) fail("wrong id");
    if (m.nfields < 0 || m.nfields > WIRE_MAX_FIELDS) fail("field count out of range");
    for (i = 0; i < m.nfields; i++) {
        const wire_field *f = &m.fields[i];
        const wire_field *first;
        char key[WIRE_MAX_KEY + 1];
        int j;
        if (f->key_len == 0 || f->key_len > WIRE_MAX_KEY) fail("key length");
        if (!inside(f->key, f->key_len, data, size) || !inside(f->val, f->len, data, size))
            fail("a field lies outside the body");
        switch (f->type) {
        case WIRE_BYTES: break;
        case WIRE_INT: if (f->len != 8) fail("INT length"); break;
        case WIRE_BOOL: if (f->len != 1 || f->val[0] > 1) fail("BOOL value"); break;
        case WIRE_INTS: if (f->len % 8 != 0) fail("INTS length"); break;
        case WIRE_STRS: walk(f); break;
        case WIRE_MAP: if (walk(f) % 2 != 0) fail("a map with an odd number of items"); break;
        default: fail("unknown type let through");
        }
        if (memchr(f->key, '\0', f->key_len) != NULL) { nul_keys = 1; continue; }
        memcpy(key, f->key, f->key_len);
        key[f->key_len] = '\0';
        first = wire_find(&m, key);
        for (j = 0; j < m.nfields; j++)
            if (m.fields[j].key_len == f->key_len && memcmp(m.fields[j].key, key, f->key_len) == 0) break;
        if (first != &m.fields[j]) fail("wire_find did not give the first field of a key");
    }
    for (raw = 1; raw >= 0; raw--) {
        if (!raw && nul_keys) break;
        rebuild(&m, &b, raw);
        if (wire_end(&b) != 0) fail("could not rebuild a parsed frame");
        if (b.len != size + 4 || wire_get_u32(b.data) != size || memcmp(b.data + 4, data, size) != 0)
            fail(raw ? "the raw rebuild differs from the input" : "the builder's rebuild differs from the input");
    }
    free(b.data);
}

/* {------------------------------------------------------ the builder side */

#include "fuzz_input.h"

static void check_build(const uint8_t *data, size_t size) {
    static const char *const keys[] = { "op", "path", "argv", "env", "data", "x", "names",
        "a-key-of-exactly-sixty-four-bytes-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "" };
    input in = { data, size };
    wire_buf b = {0};
    wire_msg m;
    int types[WIRE_MAX_FIELDS + 8];
    size_t lens[WIRE_MAX_FIELDS + 8];
    int nf = 0, op, i;
    wire_begin(&b, (uint32_t)size * 2654435761u);
    while ((op = next(&in)) >= 0 && nf < WIRE_MAX_FIELDS + 8) {
        const char *key = keys[(op >> 3) % (sizeof keys / sizeof keys[0])];
        const uint8_t *p;
        size_t at, n, k, start = b.len;
        int cnt = next(&in);
        if (cnt < 0) cnt = 0;
        switch (op & 7) {
        case 0:
        case 6:
            n = take(&in, (size_t)cnt, &p);
            wire_add_bytes(&b, key, p, n);
            types[nf] = WIRE_BYTES;
            break;
        case 1: wire_add_int(&b, key, (int64_t)((uint64_t)cnt * 0xfefefefefefefeffULL)); types[nf] = WIRE_INT; break;
        case 2: wire_add_bool(&b, key, cnt & 1); types[nf] = WIRE_BOOL; break;
        case 3:
        case 4:
            at = wire_open_list(&b, key, (op & 7) == 3 ? WIRE_STRS : WIRE_MAP);
            for (k = 0; k < (size_t)(cnt % 9) * ((op & 7) == 4 ? 2 : 1); k++) {
                int l = next(&in);
                n = take(&in, l < 0 ? 0 : (size_t)l % 17, &p);
                wire_item(&b, p, n);
            }
            wire_close_list(&b, at);
            types[nf] = (op & 7) == 3 ? WIRE_STRS : WIRE_MAP;
            break;
        default:
            at = wire_open_list(&b, key, WIRE_INTS);
            for (k = 0; k < (size_t)(cnt % 9); k++) wire_int_item(&b, (int64_t)k - 4);
            wire_close_list(&b, at);
            types[nf] = WIRE_INTS;
            break;
        }
        if (key[0] == '\0') {
            if (!b.failed) fail("the builder took an empty key");
            break;
        }
        lens[nf] = b.len - start;
        nf++;
    }
    if (wire_end(&b) == 0) {
        if (wire_get_u32(b.data) != b.len - 4) fail("wire_end wrote a wrong length");
        if (wire_parse(b.data + 4, b.len - 4, &m) != 0) {
            if (nf <= WIRE_MAX_FIELDS) fail("wire_parse refused what the builder wrote");
        } else {
            if (m.nfields != nf) fail("a built frame parsed to another number of fields");
            for (i = 0; i < nf; i++) {
                if (m.fields[i].type != types[i]) fail("a built field changed type");
                if (m.fields[i].len + 6 + m.fields[i].key_len != lens[i]) fail("a built field changed length");
            }
        }
    }
    free(b.data);
}

/* }------------------------------------------------------ */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check_parse(data, size);
    check_build(data, size);
    return 0;
}
