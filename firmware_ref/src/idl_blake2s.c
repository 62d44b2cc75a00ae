/* Keyed BLAKE2s for size (RFC 7693). See idl_blake2s.h. */
#include "idl_auth.h"

#if IDL_AUTH
#include <string.h>

/* 1 where the compiler says the target is little-endian: the block's bytes are then its message
 * words and the state's bytes the digest, no byte loader or storer is needed */
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__) \
    && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define IDL_B2S_LITTLE_ENDIAN 1
#else
#define IDL_B2S_LITTLE_ENDIAN 0
#endif

static const uint32_t IV[8] = { 0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au,
                                0x510E527Fu, 0x9B05688Cu, 0x1F83D9ABu, 0x5BE0CD19u };

/* RFC 7693's sigma, ten rows of 16 message indices, two a byte (low nibble first): byte
 * 8 * round + g holds the two words the g-th G function of that round adds. */
static const uint8_t SIGMA[80] = {
    0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE, 0xAE, 0x84, 0xF9, 0x6D, 0xC1, 0x20, 0x7B, 0x35,
    0x8B, 0x0C, 0x25, 0xDF, 0xEA, 0x63, 0x17, 0x49, 0x97, 0x13, 0xCD, 0xEB, 0x62, 0xA5, 0x04, 0x8F,
    0x09, 0x75, 0x42, 0xFA, 0x1E, 0xCB, 0x86, 0xD3, 0xC2, 0xA6, 0xB0, 0x38, 0xD4, 0x57, 0xEF, 0x91,
    0x5C, 0xF1, 0xDE, 0xA4, 0x70, 0x36, 0x29, 0xB8, 0xBD, 0xE7, 0x1C, 0x93, 0x05, 0x4F, 0x68, 0xA2,
    0xF6, 0x9E, 0x3B, 0x80, 0x2C, 0x7D, 0x41, 0x5A, 0x2A, 0x48, 0x67, 0x51, 0xBF, 0xE9, 0xC3, 0x0D
};

static uint32_t ror(uint32_t x, unsigned n) { return (x >> n) | (x << (32u - n)); }

/* F of RFC 7693 section 3.2 on the block `m` (words), `t` bytes hashed, `last` 0 or all ones;
 * then the block is zeroed: the next block's padding (the key block's included). The chain
 * value is kept as its difference from the IV, `hd` = h ^ IV (F's last step is the same on it):
 * its start is the parameter block alone, zeros but for one word. */
static void compress(uint32_t hd[8], uint32_t m[16], uint32_t t, uint32_t last)
{
    uint32_t v[16];
    unsigned i;
#if !IDL_B2S_LITTLE_ENDIAN
    for (i = 0; i < 16u; i++) { /* the words of the block, little-endian, in place */
        const uint8_t *p = (const uint8_t *)&m[i];
        m[i] = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16)
               | ((uint32_t)p[3] << 24);
    }
#endif
    for (i = 0; i < 8u; i++) {
        v[i] = hd[i] ^ IV[i];
        v[i + 8u] = IV[i];
    }
    v[12] ^= t;
    v[14] ^= last;
    for (i = 0; i < 80u; i++) { /* ten rounds of eight G */
        /* the g-th G (g = i & 7) works on row k's word 4k + ((g + k * s) & 3): s 0 for the
         * four columns, 1 for the four diagonals (computed: smaller than a table; (g + 3s) & 3
         * is (g - s) & 3; these forms are the ones gcc -Os made smallest and fastest, measured) */
        unsigned g = i & 3u;
        unsigned s = (i >> 2) & 1u;
        uint32_t *va = &v[g];
        uint32_t *vb = &v[4u + ((g + s) & 3u)];
        uint32_t *vc = v + 8 + ((g + 2u * s) & 3u);
        uint32_t *vd = v + 12 + ((g - s) & 3u);
        unsigned x = SIGMA[i];
        uint32_t a = *va, b = *vb, c = *vc, d = *vd;
        a += b + m[x & 15u];
        d = ror(d ^ a, 16u);
        c += d;
        b = ror(b ^ c, 12u);
        a += b + m[x >> 4];
        d = ror(d ^ a, 8u);
        c += d;
        b = ror(b ^ c, 7u);
        *va = a;
        *vb = b;
        *vc = c;
        *vd = d;
    }
    for (i = 0; i < 8u; i++) {
        hd[i] ^= v[i] ^ v[i + 8u];
    }
    memset(m, 0, 64u);
}

unsigned idl_blake2s(uint8_t *out, unsigned outlen, const uint8_t *key, const idl_piece_t *pieces,
                     unsigned count)
{
    uint32_t st[24]; /* the chain value less the IV (8 words), then the block */
    uint32_t *d = st;
    uint32_t *m = st + 8; /* the block: bytes as they come, words when compressed */
    uint8_t *b = (uint8_t *)m;
    unsigned diff = 0;
    unsigned i;
    uint32_t t = 0; /* bytes hashed before the block (the counter's high word stays 0) */
    unsigned c = 64u; /* bytes in the block: the key block first */
    memset(st, 0, sizeof st);
    memcpy(m, key, 32u); /* the key block: the key, zeros to 64 bytes */
    /* the parameter block: digest length, key length 32, fanout and depth 1 */
    d[0] = 0x01012000u ^ outlen;
    for (; count != 0u; count--, pieces++) {
        const uint8_t *p = pieces->p;
        size_t n;
        for (n = pieces->n; n != 0u; n--) {
            if (c == 64u) { /* a full block, and more follows: not the last */
                t += 64u;
                compress(d, m, t, 0u);
                c = 0;
            }
            b[c++] = *p++;
        }
    }
    compress(d, m, t + c, 0xFFFFFFFFu);
    for (i = 0; i < outlen; i++) { /* the digest to `out`, compared with what it held */
#if IDL_B2S_LITTLE_ENDIAN
        /* the words' bytes are the digest's */
        uint8_t x = (uint8_t)(((const uint8_t *)d)[i] ^ ((const uint8_t *)IV)[i]);
#else
        uint8_t x = (uint8_t)((d[i >> 2] ^ IV[i >> 2]) >> (8u * (i & 3u)));
#endif
        diff |= (unsigned)(out[i] ^ x);
        out[i] = x;
    }
    return diff;
}
#else
typedef int idl_blake2s_unused; /* ISO C: a translation unit is never empty */
#endif
