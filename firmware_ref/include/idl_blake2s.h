/**
 * @file idl_blake2s.h
 * @brief Keyed BLAKE2s (RFC 7693), written for size: the one primitive of authenticated frames
 *        (issue 23, docs/SECURITY.md). Compiled in with IDL_AUTH=1 only.
 *
 * One call hashes a list of pieces (pointer, length) as if they were one message, so a frame's
 * MAC runs over the direction byte, the header and the payload where they lie, without copying
 * the frame. Always keyed, with IDL_KEY_LEN (32) bytes: every key of the protocol (long-term and
 * session keys) has that length, and nothing on the device hashes unkeyed. The digest is written
 * over `out` and compared with what `out` held, every byte (no early exit): a tag is checked by
 * computing it over the received one.
 *
 * Size choices (Cortex-M0+, -Os): the ten rounds and the eight G functions of a round run in one
 * loop whose state indices are computed, not tabled; the message schedule (sigma) is packed as
 * nibbles (80 bytes); one compression serves the key id, the key derivation and the MAC; the
 * chain value is kept as its difference from the IV (it starts as the parameter word alone:
 * one memset clears it with the block, no IV copy); the key block is padded in place (the block
 * buffer is zeroed after each compression); the byte counter is 32 bits (its high word stays 0:
 * messages up to 4 GiB - 64 bytes, a frame is at most IDL_MAX_FRAME); on a little-endian target
 * the block's bytes are its message words (no loader). No libc call but memset and memcpy (which
 * the core already uses), no dynamic memory, about 230 bytes of stack (Cortex-M0+).
 */
#ifndef IDL_BLAKE2S_H
#define IDL_BLAKE2S_H

#include <stddef.h>
#include <stdint.h>

/** One piece of a message: `n` bytes at `p`. */
typedef struct {
    const uint8_t *p;
    size_t n;
} idl_piece_t;

/** BLAKE2s keyed with the 32 bytes at `key` of the concatenated `count` pieces: `outlen` (1..32)
 *  bytes written to `out`. Returns 0 if `out` held that digest already, non-zero otherwise (every
 *  byte compared; a caller that only wants the digest ignores it). Messages up to 4 GiB - 64
 *  bytes. */
unsigned idl_blake2s(uint8_t *out, unsigned outlen, const uint8_t *key, const idl_piece_t *pieces,
                     unsigned count);

#endif /* IDL_BLAKE2S_H */
