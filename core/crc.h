/*
** crc.h: the CRC-32 table and mc_crc32 (IEEE 802.3), for core.crc32 (crc.c)
** and the core's parsers that check one (stream.c's AWS event-stream).
*/
#ifndef MAYURA_CRC_H
#define MAYURA_CRC_H

#include "mc.h"

static uint32_t crc_table[256] __attribute__((unused));
static int crc_table_ready __attribute__((unused)) = 0;

MC_FN void crc_init(void) {
    uint32_t i, k, c;
    for (i = 0; i < 256; i++) {
        c = i;
        for (k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
    crc_table_ready = 1;
}

/* The CRC-32 of p[0..n), continuing `crc` (0 to start); for the core's own parsers. */
MC_FN uint32_t mc_crc32(uint32_t crc, const unsigned char *p, size_t n) {
    uint32_t c;
    size_t i;
    if (!crc_table_ready) crc_init();
    c = ~crc;
    for (i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return ~c;
}

#endif
