/*
** fileops.c: the file requests (read, write, list, remove), over the file
** layer shared with the host (core/files.h).
*/
#include "agent.h"

/* {------------------------------------------------------
** File operations
** -------------------------------------------------------*/

void op_read(conn *c, const wire_msg *m) {
    int64_t max = (int64_t)WIRE_MAX_FRAME - 4096;
    char *path;
    int fd, fl, e = 0;
    struct stat st;
    wire_buf b = {0};
    size_t at, len = 0, limit;
    if (field_int(m, "max_bytes", &max, 0, (int64_t)WIRE_MAX_FRAME - 4096) != 0) {
        reply_error(c, m->id, "invalid", "field 'max_bytes' is out of range");
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
    /* read straight into the reply; the data field's length is filled in at the end */
    wire_begin(&b, m->id);
    at = wire_open_list(&b, "data", WIRE_BYTES);
    if (wire_reserve(&b, (size_t)st.st_size + 1) != 0) e = ENOMEM;
    /* at most limit + 1 bytes: one byte more than allowed says the file grew since fstat */
    while (e == 0 && len <= limit) {
        size_t room;
        ssize_t n;
        if (b.len == b.size) {
            size_t more = len < 65536 ? 65536 : len;
            if (more > limit + 1 - len) more = limit + 1 - len;
            if (wire_reserve(&b, more) != 0) { e = ENOMEM; break; }
        }
        room = b.size - b.len;
        if (room > limit + 1 - len) room = limit + 1 - len;
        n = read(fd, b.data + b.len, room);
        if (n < 0) {
            if (errno != EINTR) e = errno;
            continue;
        }
        if (n == 0) break;
        b.len += (size_t)n;
        len += (size_t)n;
    }
    close(fd);
    if (e != 0) {
        free(b.data);
        reply_errno(c, m->id, e, "read");
    } else if (len > limit) {
        free(b.data);
        reply_error(c, m->id, "too_large", "the file is larger than %zu bytes", limit);
    } else {
        wire_close_list(&b, at);
        reply_send(c, m->id, &b);
    }
}

/* Whether path names a directory (following symlinks). */
void op_write(conn *c, const wire_msg *m) {
    const unsigned char *data = NULL;
    size_t dlen = 0;
    int64_t mode = 0644;
    char *path;
    int e;
    if (wire_find(m, "data") == NULL || field_bytes(m, "data", &data, &dlen) != 0) {
        reply_error(c, m->id, "invalid", "field 'data' is missing or not bytes");
        return;
    }
    if (field_int(m, "mode", &mode, 0, 07777) != 0) {
        reply_error(c, m->id, "invalid", "field 'mode' must be an int from 0 to 07777");
        return;
    }
    if ((path = path_field(c, m)) == NULL) return;
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
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno == ENOENT) continue;   /* removed since readdir */
            e = errno;
            break;
        }
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 64;
            entry *ne = (entry *)realloc(ents, nc * sizeof *ne);
            if (ne == NULL) { e = ENOMEM; break; }
            ents = ne;
            cap = nc;
        }
        if ((ents[n].name = strdup(de->d_name)) == NULL) { e = ENOMEM; break; }
        ents[n].type = files_type_name(st.st_mode);
        ents[n].size = (int64_t)st.st_size;
        ents[n].mtime = (int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000;
        n++;
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
