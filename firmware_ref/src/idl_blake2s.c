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

/* The state words of the eight G functions of a round: a is g & 3; b, c, d are the nibbles of
 * G_BCD[g] (four columns, then four diagonals). */
static const uint16_t G_BCD[8] = { 0xC84, 0xD95, 0xEA6, 0xFB7, 0xFA5, 0xCB6, 0xD87, 0xE94 };

static uint32_t ror(uint32_t x, unsigned n) { return (x >> n) | (x << (32u - n)); }

/* F of RFC 7693 section 3.2 on the block `m` (words), `t` bytes hashed, `last` 0 or all ones;
 * then the block is zeroed: the next block's padding (the key block's included). */
static void compress(uint32_t h[8], uint32_t m[16], uint32_t t, uint32_t last)
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
    memcpy(v, h, 32u);
    memcpy(v + 8, IV, 32u);
    v[12] ^= t;
    v[14] ^= last;
    for (i = 0; i < 80u; i++) { /* ten rounds of eight G */
        unsigned g = G_BCD[i & 7u];
        uint32_t *va = &v[i & 3u];
        uint32_t *vb = &v[g & 15u];
        uint32_t *vc = &v[(g >> 4) & 15u];
        uint32_t *vd = &v[g >> 8];
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
        h[i] ^= v[i] ^ v[i + 8u];
    }
    memset(m, 0, 64u);
}

void idl_blake2s(uint8_t *out, unsigned outlen, const uint8_t *key, const idl_piece_t *pieces,
                 unsigned count)
{
    uint32_t h[8];
    uint32_t m[16]; /* the block: bytes as they come, words when compressed */
    uint8_t *b = (uint8_t *)m;
    const uint8_t *p = key;
    size_t n = key != NULL ? 32u : 0u;
    uint32_t t = 0; /* bytes hashed so far (the counter's high word stays 0) */
    unsigned c = 0; /* bytes in the block */
#if !IDL_B2S_LITTLE_ENDIAN
    unsigned i;
#endif
    memset(m, 0, sizeof m);
    memcpy(h, IV, sizeof h);
    /* the parameter block: digest length, key length 32 (or 0), fanout and depth 1 */
    h[0] ^= 0x01010000u ^ outlen ^ (key != NULL ? 0x2000u : 0u);
    for (;;) {
        while (n != 0u) {
            if (c == 64u) { /* a full block, and more follows: not the last */
                t += 64u;
                compress(h, m, t, 0u);
                c = 0;
            }
            b[c++] = *p++;
            n--;
        }
        if (key != NULL) { /* the key block: the key, zeros to 64 bytes */
            c = 64u;
            key = NULL;
        }
        if (count == 0u) {
            break;
        }
        p = pieces->p;
        n = pieces->n;
        pieces++;
        count--;
    }
    compress(h, m, t + c, 0xFFFFFFFFu);
#if IDL_B2S_LITTLE_ENDIAN
    memcpy(out, h, outlen); /* the words' bytes are the digest's */
#else
    for (i = 0; i < outlen; i++) {
        out[i] = (uint8_t)(h[i >> 2] >> (8u * (i & 3u)));
    }
#endif
}
#else
typedef int idl_blake2s_unused; /* ISO C: a translation unit is never empty */
#endif
