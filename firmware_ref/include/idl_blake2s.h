/**
 * @file idl_blake2s.h
 * @brief Keyed BLAKE2s (RFC 7693), written for size: the one primitive of authenticated frames
 *        (issue 23, docs/SECURITY.md). Compiled in with IDL_AUTH=1 only.
 *
 * One call hashes a list of pieces (pointer, length) as if they were one message, so a frame's
 * MAC runs over the direction byte, the header and the payload where they lie, without copying
 * the frame. The key, when given, is IDL_KEY_LEN (32) bytes: every key of the protocol (long-term
 * and session keys) has that length; NULL hashes unkeyed (RFC 7693's "abc" known-answer test).
 *
 * Size choices (Cortex-M0+, -Os): the ten rounds and the eight G functions of a round run in one
 * loop whose state indices are computed, not tabled; the message schedule (sigma) is packed as
 * nibbles (80 bytes); one compression serves the key id, the key derivation and the MAC; the key
 * block is padded in place (the block buffer is zeroed after each compression); on a
 * little-endian target the block's bytes are its message words (no loader). No libc call but
 * memset (which the core already uses), no dynamic memory, about 120 bytes of stack.
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

/** BLAKE2s of the concatenated `count` pieces, `outlen` (1..32) bytes to `out`, keyed with the
 *  32 bytes at `key` (NULL: unkeyed). Messages up to 4 GiB - 64 bytes. */
void idl_blake2s(uint8_t *out, unsigned outlen, const uint8_t *key, const idl_piece_t *pieces,
                 unsigned count);

#endif /* IDL_BLAKE2S_H */
