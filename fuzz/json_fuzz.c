/*
** json_fuzz: core.json.decode on arbitrary bytes, through a real lua_State.
**
**  - json_scan and json_mark_nuls run first on the input buffer itself
**    (exactly sized, so a read one byte past the text is caught);
**  - decode either gives a value or nil + an INVALID_INPUT error, and never
**    raises for a string; it takes exactly what a reference reader of the
**    RFC 8259 grammar (written here) takes, but where the decoder documents
**    its own choice (see ref_valid);
**  - a value decoded is encoded again (only an object key holding a NUL
**    byte may be refused: cJSON keeps keys as C strings), and that text
**    decodes to the same value (fuzz_json.h), with the same nesting;
**  - max_depth = the text's nesting decodes it, one less refuses it (the
**    text's, not the value's: of a key given twice the value keeps the last,
**    which may nest less than the one before it).
*/
#include "fuzz_lua.h"
#include "fuzz_json.h"

/* {------------------------------------------------------
** A reference reader of RFC 8259's grammar, written here: 1 valid, 0 not,
** -1 where the decoder makes a choice of its own (a byte order mark is
** skipped; nesting past 1000 and numbers past the range of a double are
** refused; a \u escape of a surrogate is read as UTF-16 and refused when
** unpaired).
** ------------------------------------------------------- */

typedef struct {
    const unsigned char *s;
    size_t n, i;
    int depth, unsure;
    int deepest;   /* the text's nesting */
} ref;

static void ref_ws(ref *r) {
    while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r')) r->i++;
}

static int ref_hex(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int ref_string(ref *r) {
    r->i++;   /* the opening quote */
    while (r->i < r->n) {
        unsigned char c = r->s[r->i];
        if (c == '"') { r->i++; return 1; }
        if (c < 0x20) return 0;
        if (c != '\\') { r->i++; continue; }
        if (++r->i >= r->n) return 0;
        c = r->s[r->i];
        if (c == 'u') {
            int k, code = 0;
            if (r->n - r->i < 5) return 0;
            for (k = 1; k <= 4; k++) {
                int h = ref_hex(r->s[r->i + k]);
                if (h < 0) return 0;
                code = code * 16 + h;
            }
            if (code >= 0xd800 && code <= 0xdfff) r->unsure = 1;
            r->i += 5;
        } else if (c != 0 && strchr("\"\\/bfnrt", c) != NULL) {
            r->i++;
        } else {
            return 0;
        }
    }
    return 0;
}

static int ref_digits(ref *r) {
    size_t at = r->i;
    while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
    return r->i > at;
}

static int ref_number(ref *r) {
    size_t at = r->i;
    if (r->s[r->i] == '-') r->i++;
    if (r->i < r->n && r->s[r->i] == '0') r->i++;
    else if (r->i >= r->n || r->s[r->i] < '1' || r->s[r->i] > '9' || !ref_digits(r)) return 0;
    if (r->i < r->n && r->s[r->i] == '.') {
        r->i++;
        if (!ref_digits(r)) return 0;
    }
    if (r->i < r->n && (r->s[r->i] == 'e' || r->s[r->i] == 'E')) {
        r->i++;
        if (r->i < r->n && (r->s[r->i] == '+' || r->s[r->i] == '-')) r->i++;
        if (!ref_digits(r)) return 0;
    }
    {
        /* past the range of a double: the decoder refuses it (a limit RFC 8259 allows) */
        char *copy = (char *)malloc(r->i - at + 1);
        if (copy == NULL) abort();
        memcpy(copy, r->s + at, r->i - at);
        copy[r->i - at] = '\0';
        if (!isfinite(strtod(copy, NULL))) r->unsure = 1;
        free(copy);
    }
    return 1;
}

static int ref_word(ref *r, const char *w) {
    size_t l = strlen(w);
    if (r->n - r->i < l || memcmp(r->s + r->i, w, l) != 0) return 0;
    r->i += l;
    return 1;
}

static int ref_value(ref *r) {
    unsigned char c;
    ref_ws(r);
    if (r->i >= r->n) return 0;
    c = r->s[r->i];
    if (c == '[' || c == '{') {
        unsigned char close = c == '[' ? ']' : '}';
        if (++r->depth > JSON_MAX_DEPTH) { r->unsure = 1; return 0; }
        if (r->depth > r->deepest) r->deepest = r->depth;
        r->i++;
        ref_ws(r);
        if (r->i < r->n && r->s[r->i] == close) { r->i++; r->depth--; return 1; }
        for (;;) {
            if (c == '{') {
                ref_ws(r);
                if (r->i >= r->n || r->s[r->i] != '"' || !ref_string(r)) return 0;
                ref_ws(r);
                if (r->i >= r->n || r->s[r->i] != ':') return 0;
                r->i++;
            }
            if (!ref_value(r)) return 0;
            ref_ws(r);
            if (r->i >= r->n) return 0;
            if (r->s[r->i] == close) { r->i++; r->depth--; return 1; }
            if (r->s[r->i] != ',') return 0;
            r->i++;
        }
    }
    if (c == '"') return ref_string(r);
    if (c == '-' || (c >= '0' && c <= '9')) return ref_number(r);
    return ref_word(r, "true") || ref_word(r, "false") || ref_word(r, "null");
}

/* 1 valid (*deepest: its nesting), 0 not, -1 the decoder's own choice (*deepest: 0, not known). */
static int ref_valid(const unsigned char *s, size_t n, int *deepest) {
    ref r = { s, n, 0, 0, 0, 0 };
    int ok;
    *deepest = 0;
    if (n >= 3 && memcmp(s, "\xef\xbb\xbf", 3) == 0) return -1;
    ok = ref_value(&r);
    if (ok) {
        ref_ws(&r);
        ok = r.i == n;
    }
    /* past a doubt raised before the end, cJSON may stop where the reference goes on */
    if (r.unsure) return -1;
    if (ok) *deepest = r.deepest;
    return ok;
}

/* }------------------------------------------------------ */

static void scan_raw(const uint8_t *data, size_t size) {
    size_t pos = 0, n;
    int has_nul = 0, problem;
    unsigned char *copy;
    problem = json_scan(data, size, JSON_MAX_DEPTH, &pos, &has_nul);
    if (problem != JSON_OK && pos >= size) fz_fail("json_scan reports byte %zu of %zu", pos, size);
    copy = (unsigned char *)malloc(size * 2 + 1);
    if (copy == NULL) return;
    n = json_mark_nuls(data, size, copy);
    if (n > size * 2) fz_fail("json_mark_nuls wrote %zu bytes for %zu", n, size);
    free(copy);
}

/* Pushes decode(s [, {max_depth = depth}]) as two values; the call itself must not raise. */
static void decode(lua_State *L, const char *s, size_t len, int depth) {
    fz_core_fn(L, "json", "decode");
    lua_pushlstring(L, s, len);
    if (depth > 0) {
        lua_createtable(L, 0, 1);
        lua_pushinteger(L, depth);
        lua_setfield(L, -2, "max_depth");
    }
    if (lua_pcall(L, depth > 0 ? 2 : 1, 2, 0) != LUA_OK)
        fz_fail("json.decode raised: %s", fz_describe(L, -1));
    if (lua_isnil(L, -2) && !fz_is_coded(L, -1, "INVALID_INPUT"))
        fz_fail("json.decode failed without an INVALID_INPUT error");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lua_State *L = fz_state();
    int v, v2, depth, valid, text_depth;
    size_t len;
    const char *text;

    scan_raw(data, size);

    valid = ref_valid(data, size, &text_depth);
    decode(L, (const char *)data, size, 0);
    if (lua_isnil(L, -2)) {
        if (valid == 1) fz_fail("json.decode refused valid JSON: %s", fz_describe(L, -1));
        fz_end(L);
        return 0;
    }
    if (valid == 0) fz_fail("json.decode took text that is not JSON");
    lua_pop(L, 1);
    v = lua_gettop(L);
    depth = fzj_depth(L, v);

    fz_core_fn(L, "json", "encode");
    lua_pushvalue(L, v);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
        if (fz_is_coded(L, -1, "INVALID_INPUT") && strstr(fz_describe(L, -1), "NUL byte") != NULL) {
            fz_end(L);
            return 0;
        }
        fz_fail("json.encode refused what json.decode gave: %s", fz_describe(L, -1));
    }
    text = lua_tolstring(L, -1, &len);

    decode(L, text, len, 0);
    if (lua_isnil(L, -2)) fz_fail("json.decode refused what json.encode wrote: %s", fz_describe(L, -1));
    lua_pop(L, 1);
    v2 = lua_gettop(L);
    if (!fzj_same(L, v, v2)) fz_fail("round trip: %s (text %.200s)", fzj_why, text);
    if (fzj_depth(L, v2) != depth) fz_fail("round trip changed the nesting");

    if (text_depth >= 1 && text_depth <= JSON_MAX_DEPTH) {
        decode(L, (const char *)data, size, text_depth);
        if (lua_isnil(L, -2))
            fz_fail("max_depth %d refused a text %d deep: %s", text_depth, text_depth, fz_describe(L, -1));
        lua_pop(L, 2);
        if (text_depth >= 2) {
            decode(L, (const char *)data, size, text_depth - 1);
            if (!lua_isnil(L, -2) || strstr(fz_describe(L, -1), "nesting deeper") == NULL)
                fz_fail("max_depth %d took a text %d deep", text_depth - 1, text_depth);
            lua_pop(L, 2);
        }
    }
    fz_end(L);
    return 0;
}
