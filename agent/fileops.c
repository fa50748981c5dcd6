/*
** fileops.c: the file requests (read, write, list, remove), over the file
** layer shared with the host (core/files.h).
**
** A large file moves in parts, each its own request, so that neither end
** handles a whole file in one frame (the host's loop then stays responsive):
**  - read with `length` (and `offset`) answers that range of the file, with
**    the file's `size`, `ino` and `mtime_ns` (the host checks that every part
**    came from the same file) and `eof` once the range reached its end;
**  - write with `more` begins an upload: the bytes go to a temporary file
**    beside the path and the reply names it (`upload`); each later part
**    (`upload`, `data`, `more`) appends, and the last (no `more`) renames it
**    over the path, all or nothing; `abort` drops it. An upload that fails,
**    is aborted, is idle for UPLOAD_IDLE_MS, or whose connection ends, is
**    removed with its temporary file, so an abandoned one leaves nothing.
** Without those fields a read or write moves the whole file at once.
*/
#include "agent.h"

/* {------------------------------------------------------
** Uploads: writes in parts
** -------------------------------------------------------*/

#define UPLOAD_MAX 64            /* at once; one more is refused (EMFILE) */
#define UPLOAD_IDLE_MS 60000     /* without a part for this long, it is dropped */

typedef struct upload {
    struct upload *next;
    conn *c;
    uint32_t token;
    int fd;                      /* the temporary file, -1 once closed */
    char *tmp, *path;
    mode_t mode;
    int64_t last;                /* ms, its last part */
} upload;

static upload *uploads;
static uint32_t upload_counter;
static int nuploads;

/* Unlinks u from the list and frees it; with remove, its temporary file is removed too. */
static void upload_free(upload *u, int remove) {
    upload **pp;
    for (pp = &uploads; *pp != NULL; pp = &(*pp)->next)
        if (*pp == u) { *pp = u->next; break; }
    fd_close(&u->fd);
    if (remove && u->tmp != NULL) unlink(u->tmp);
    free(u->tmp);
    free(u->path);
    free(u);
    nuploads--;
}

void uploads_drop(const conn *c) {
    upload *u = uploads, *next;
    for (; u != NULL; u = next) {
        next = u->next;
        if (c == NULL || u->c == c) upload_free(u, 1);
    }
}

int64_t uploads_wake(int64_t wake) {
    upload *u;
    for (u = uploads; u != NULL; u = u->next)
        if (u->last + UPLOAD_IDLE_MS < wake) wake = u->last + UPLOAD_IDLE_MS;
    return wake;
}

void uploads_expire(int64_t now) {
    upload *u = uploads, *next;
    for (; u != NULL; u = next) {
        next = u->next;
        if (now >= u->last + UPLOAD_IDLE_MS) upload_free(u, 1);
    }
}

/* The first part of an upload: the temporary file beside path (taken) with data in it. */
static void upload_begin(conn *c, uint32_t id, char *path, const unsigned char *data, size_t len, mode_t mode) {
    upload *u = NULL;
    char *tmp = NULL;
    int fd = -1, e = nuploads >= UPLOAD_MAX ? EMFILE : 0;
    wire_buf b = {0};
    /* a name ending in '/' is EISDIR; missing parents are made */
    if (e == 0) e = files_temp_beside(path, 1, &fd, &tmp);
    if (e == 0) e = files_write_all(fd, data, len);
    if (e == 0 && (u = (upload *)calloc(1, sizeof *u)) == NULL) e = ENOMEM;
    if (e != 0) {
        fd_close(&fd);
        if (tmp != NULL) unlink(tmp);
        free(tmp);
        free(path);
        reply_errno(c, id, e, "write");
        return;
    }
    u->c = c;
    u->token = ++upload_counter ? upload_counter : ++upload_counter;   /* never 0 */
    u->fd = fd;
    u->tmp = tmp;
    u->path = path;
    u->mode = mode;
    u->last = now_ms();
    u->next = uploads;
    uploads = u;
    nuploads++;
    wire_begin(&b, id);
    wire_add_bool(&b, "ok", 1);
    wire_add_int(&b, "upload", u->token);
    conn_send(c, &b);
}

/* A later part of upload `token`: appended; the last one (no `more`) renames it over its path. */
static void upload_part(conn *c, const wire_msg *m, uint32_t token, int more, int drop) {
    const unsigned char *data = NULL;
    size_t dlen = 0;
    upload *u;
    int e;
    for (u = uploads; u != NULL; u = u->next)
        if (u->c == c && u->token == token) break;
    if (u == NULL) {
        reply_error(c, m->id, "invalid", "field 'upload' names no upload in progress");
        return;
    }
    if (drop) {
        upload_free(u, 1);
        reply_ok(c, m->id, "ok");
        return;
    }
    if (wire_find(m, "data") == NULL || field_bytes(m, "data", &data, &dlen) != 0) {
        upload_free(u, 1);
        reply_error(c, m->id, "invalid", "field 'data' is missing or not bytes");
        return;
    }
    e = files_write_all(u->fd, data, dlen);
    if (e == 0 && !more) {
        e = files_temp_commit(u->fd, u->tmp, u->path, u->mode);   /* closes it; removes it on failure */
        u->fd = -1;
        upload_free(u, 0);
        u = NULL;
    }
    if (e != 0) {
        if (u != NULL) upload_free(u, 1);
        reply_errno(c, m->id, e, "write");
        return;
    }
    if (u != NULL) u->last = now_ms();
    reply_ok(c, m->id, "ok");
}

/* }------------------------------------------------------ */

/* {------------------------------------------------------
** File operations
** -------------------------------------------------------*/

/*
** Reads up to cap bytes of fd, from offset (-1: from where it is), straight
** into b, first making room for expect bytes and growing as more come;
** *len says how many came. Returns 0 or an errno.
*/
static int read_into(int fd, wire_buf *b, int64_t offset, size_t cap, size_t expect, size_t *len) {
    *len = 0;
    if (wire_reserve(b, expect < cap ? expect : cap) != 0) return ENOMEM;
    while (*len < cap) {
        size_t room;
        ssize_t n;
        if (b->len == b->size) {
            size_t more = *len < 65536 ? 65536 : *len;
            if (more > cap - *len) more = cap - *len;
            if (wire_reserve(b, more) != 0) return ENOMEM;
        }
        room = b->size - b->len;
        if (room > cap - *len) room = cap - *len;
        n = offset < 0 ? read(fd, b->data + b->len, room) : pread(fd, b->data + b->len, room, (off_t)(offset + (int64_t)*len));
        if (n < 0) {
            if (errno != EINTR) return errno;
            continue;
        }
        if (n == 0) break;
        b->len += (size_t)n;
        *len += (size_t)n;
    }
    return 0;
}

/*
** read: the whole file (at most max_bytes), or with `length` the range of
** at most length bytes from `offset` (a part of a larger file, see above).
*/
void op_read(conn *c, const wire_msg *m) {
    int64_t max = (int64_t)WIRE_MAX_FRAME - 4096, offset = 0, length = -1;
    char *path;
    int fd, fl, e;
    struct stat st;
    wire_buf b = {0};
    size_t at, len = 0, limit, cap, expect;
    if (field_int(m, "max_bytes", &max, 0, (int64_t)WIRE_MAX_FRAME - 4096) != 0) {
        reply_error(c, m->id, "invalid", "field 'max_bytes' is out of range");
        return;
    }
    if (field_int(m, "offset", &offset, 0, MAX_FILE_OFFSET) != 0 ||
        field_int(m, "length", &length, 1, (int64_t)WIRE_MAX_FRAME - 4096) != 0) {
        reply_error(c, m->id, "invalid", "field 'offset' or 'length' is out of range");
        return;
    }
    if ((path = path_field(c, m)) == NULL) return;
    /* O_NONBLOCK: opening a fifo with no writer must not hang; it is refused below */
    fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    free(path);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR) reply_ok(c, m->id, "missing");
        else reply_errno(c, m->id, errno, "open");
        return;
    }
    if (fstat(fd, &st) != 0) { reply_errno(c, m->id, errno, "fstat"); close(fd); return; }
    if (S_ISDIR(st.st_mode)) { reply_error(c, m->id, "is_directory", "is a directory"); close(fd); return; }
    if (!S_ISREG(st.st_mode)) { reply_error(c, m->id, "not_regular", "not a regular file"); close(fd); return; }
    limit = (size_t)max;
    if ((uint64_t)st.st_size > (uint64_t)limit) {
        reply_error(c, m->id, "too_large", "the file is larger than %zu bytes", limit);
        close(fd);
        return;
    }
    if ((fl = fcntl(fd, F_GETFL)) >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    /* the whole file: at most limit + 1 bytes, one byte more than allowed says it grew since fstat */
    cap = length < 0 ? limit + 1 : (size_t)length;
    expect = length < 0 ? (size_t)st.st_size + 1
           : (st.st_size > offset ? (size_t)(st.st_size - offset) + 1 : 1);
    /* read straight into the reply; the data field's length is filled in at the end */
    wire_begin(&b, m->id);
    at = wire_open_list(&b, "data", WIRE_BYTES);
    e = read_into(fd, &b, length < 0 ? -1 : offset, cap, expect, &len);
    close(fd);
    if (e != 0) {
        free(b.data);
        reply_errno(c, m->id, e, "read");
    } else if ((uint64_t)(length < 0 ? 0 : offset) + len > (uint64_t)limit) {
        free(b.data);
        reply_error(c, m->id, "too_large", "the file is larger than %zu bytes", limit);
    } else {
        wire_close_list(&b, at);
        if (length >= 0) {
            wire_add_int(&b, "size", (int64_t)st.st_size);
            wire_add_int(&b, "ino", (int64_t)st.st_ino);
            wire_add_int(&b, "mtime_ns", (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec);
            wire_add_bool(&b, "eof", len < cap || offset + (int64_t)len >= (int64_t)st.st_size);
        }
        reply_send(c, m->id, &b);
    }
}

/*
** write: the whole file at once (all or nothing, see files_write_atomic), or
** an upload's first part (`more`), or a later one (`upload`).
*/
void op_write(conn *c, const wire_msg *m) {
    const unsigned char *data = NULL;
    size_t dlen = 0;
    int64_t mode = 0644, token = 0;
    char *path;
    int e, more = 0, drop = 0;
    if (field_bool(m, "more", &more) != 0 || field_bool(m, "abort", &drop) != 0 ||
        field_int(m, "upload", &token, 1, UINT32_MAX) != 0) {
        reply_error(c, m->id, "invalid", "field 'more', 'abort' or 'upload' is not valid");
        return;
    }
    if (wire_find(m, "upload") != NULL) {
        upload_part(c, m, (uint32_t)token, more, drop);
        return;
    }
    if (drop) {
        reply_error(c, m->id, "invalid", "field 'abort' goes with 'upload'");
        return;
    }
    if (wire_find(m, "data") == NULL || field_bytes(m, "data", &data, &dlen) != 0) {
        reply_error(c, m->id, "invalid", "field 'data' is missing or not bytes");
        return;
    }
    if (field_int(m, "mode", &mode, 0, 07777) != 0) {
        reply_error(c, m->id, "invalid", "field 'mode' must be an int from 0 to 07777");
        return;
    }
    if ((path = path_field(c, m)) == NULL) return;
    if (more) {
        upload_begin(c, m->id, path, data, dlen, (mode_t)mode);   /* takes path */
        return;
    }
    /* a name ending in '/' is EISDIR; missing parents are made */
    e = files_write_atomic(path, data, dlen, (mode_t)mode, 1);
    free(path);
    if (e != 0) reply_errno(c, m->id, e, "write");
    else reply_ok(c, m->id, "ok");
}

typedef struct entry {
    char *name;
    const char *type;
    int64_t size, mtime;
} entry;

static int entry_cmp(const void *a, const void *b) {
    return strcmp(((const entry *)a)->name, ((const entry *)b)->name);
}

/* The most a listing holds: beyond either, the reply is the error 'too_many_entries'. */
#define LIST_MAX_ENTRIES 100000
#define LIST_MAX_NAME_BYTES (16u << 20)

void op_list(conn *c, const wire_msg *m) {
    char *path;
    int fd, e = 0, over = 0;
    DIR *d;
    struct dirent *de;
    struct stat st;
    entry *ents = NULL;
    size_t n = 0, cap = 0, i, at, name_bytes = 0;
    wire_buf b = {0};
    if ((path = path_field(c, m)) == NULL) return;
    fd = open(path, O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        e = errno;
        if (e == ENOENT) reply_ok(c, m->id, "missing");
        else if (e == ENOTDIR && stat(path, &st) == 0) reply_error(c, m->id, "not_directory", "not a directory");
        else if (e == ENOTDIR) reply_ok(c, m->id, "missing");   /* a file in the middle of the path */
        else reply_errno(c, m->id, e, "open");
        free(path);
        return;
    }
    free(path);
    if ((d = fdopendir(fd)) == NULL) { reply_errno(c, m->id, errno, "opendir"); close(fd); return; }
    for (;;) {
        errno = 0;
        de = readdir(d);
        if (de == NULL) { e = errno; break; }
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        name_bytes += strlen(de->d_name);
        if (n == LIST_MAX_ENTRIES || name_bytes > LIST_MAX_NAME_BYTES) { over = 1; break; }
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 64;
            entry *ne = (entry *)realloc(ents, nc * sizeof *ne);
            if (ne == NULL) { e = ENOMEM; break; }
            ents = ne;
            cap = nc;
        }
        if ((ents[n].name = strdup(de->d_name)) == NULL) { e = ENOMEM; break; }
        n++;
    }
    /* each entry's stat once its names are known to be within the caps: a directory over them costs
    ** a read of its names, never a stat of each of its 100,000 first */
    if (!over && e == 0) {
        size_t kept = 0;
        for (i = 0; i < n; i++) {
            if (e == 0 && fstatat(dirfd(d), ents[i].name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
                ents[kept].name = ents[i].name;
                ents[kept].type = files_type_name(st.st_mode);
                ents[kept].size = (int64_t)st.st_size;
                ents[kept].mtime = (int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000;
                kept++;
                continue;
            }
            if (e == 0 && errno != ENOENT) e = errno;   /* ENOENT: removed since readdir */
            free(ents[i].name);
        }
        n = kept;
    }
    closedir(d);
    if (over) {
        reply_error(c, m->id, "too_many_entries", "the directory has more than %d entries or %u bytes of names",
                    LIST_MAX_ENTRIES, LIST_MAX_NAME_BYTES);
    } else if (e != 0) {
        reply_errno(c, m->id, e, "list");
    } else {
        if (n > 1) qsort(ents, n, sizeof *ents, entry_cmp);
        wire_begin(&b, m->id);
        at = wire_open_list(&b, "names", WIRE_STRS);
        for (i = 0; i < n; i++) wire_item(&b, ents[i].name, strlen(ents[i].name));
        wire_close_list(&b, at);
        at = wire_open_list(&b, "types", WIRE_STRS);
        for (i = 0; i < n; i++) wire_item(&b, ents[i].type, strlen(ents[i].type));
        wire_close_list(&b, at);
        at = wire_open_list(&b, "sizes", WIRE_INTS);
        for (i = 0; i < n; i++) wire_int_item(&b, ents[i].size);
        wire_close_list(&b, at);
        at = wire_open_list(&b, "modified", WIRE_INTS);
        for (i = 0; i < n; i++) wire_int_item(&b, ents[i].mtime);
        wire_close_list(&b, at);
        reply_send(c, m->id, &b);
    }
    for (i = 0; i < n; i++) free(ents[i].name);
    free(ents);
}

void op_remove(conn *c, const wire_msg *m) {
    int recursive = 0, e = 0;
    char *path, *slash;
    size_t len;
    struct stat st;
    wire_buf b = {0};
    if (field_bool(m, "recursive", &recursive) != 0) {
        reply_error(c, m->id, "invalid", "field 'recursive' must be a bool");
        return;
    }
    if ((path = path_field(c, m)) == NULL) return;
    len = strlen(path);
    while (len > 1 && path[len - 1] == '/') path[--len] = '\0';
    slash = strrchr(path, '/');
    if (slash != NULL && (strcmp(slash, "/.") == 0 || strcmp(slash, "/..") == 0)) {
        free(path);
        reply_error(c, m->id, "invalid", "field 'path' must not end in . or ..");
        return;
    }
    if (lstat(path, &st) != 0) {
        e = errno;
        free(path);
        if (e == ENOENT || e == ENOTDIR) {
            wire_begin(&b, m->id);
            wire_add_bool(&b, "removed", 0);
            conn_send(c, &b);
        } else {
            reply_errno(c, m->id, e, "lstat");
        }
        return;
    }
    if (strcmp(path, "/") == 0) { free(path); reply_errno(c, m->id, EBUSY, "remove"); return; }
    if (!S_ISDIR(st.st_mode)) {
        if (unlink(path) != 0 && errno != ENOENT) e = errno;
    } else if (!recursive) {
        if (rmdir(path) != 0 && errno != ENOENT) e = errno == EEXIST ? ENOTEMPTY : errno;
    } else {
        /* the walk starts from the parent's descriptor, so the last component is never followed */
        int dfd;
        slash = strrchr(path, '/');
        if (slash == path) dfd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        else {
            *slash = '\0';
            dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            *slash = '/';
        }
        if (dfd < 0) e = errno;
        else {
            e = files_remove_at(dfd, slash + 1, DT_DIR);
            close(dfd);
        }
    }
    free(path);
    if (e != 0) { reply_errno(c, m->id, e, "remove"); return; }
    wire_begin(&b, m->id);
    wire_add_bool(&b, "removed", 1);
    conn_send(c, &b);
}

/* }------------------------------------------------------ */
