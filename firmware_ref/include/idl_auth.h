/**
 * @file idl_auth.h
 * @brief The keyed device's side of authenticated sessions (issue 23, docs/SECURITY.md): the
 *        rules of protocol/auth.py DeviceAuth, byte for byte. Compiled in with IDL_AUTH=1.
 *
 * | HELLO without the auth extension      | reply unsigned, AUTH with the current key id and |
 * | or naming a key the device lacks      | the device nonce; the session key (if any) stays |
 * | HELLO naming a key the device holds   | a fresh device nonce (the same one again if the  |
 * |                                       | host nonce is the last keyed HELLO's), the       |
 * |                                       | session key derived, the reply signed with it    |
 * | any other frame                       | its tag verified by the decoder right after the  |
 * |                                       | CRC (BAD_MAC); unverified: counted               |
 * |                                       | IDL_DISP_UNAUTHENTICATED, never run; a REQUEST   |
 * |                                       | without a tag gets AUTHENTICATION_REQUIRED,      |
 * |                                       | unsigned (idl_session.h)                         |
 *
 * Keys: session key = BLAKE2s-256 keyed with the long-term key over IDL_KDF_LABEL | host nonce |
 * device nonce | len(device id) u8 | device id | address u8 (0xFF point-to-point); key id =
 * BLAKE2s-32 keyed with the long-term key over "idemlink key id v1", LE. The long-term keys stay
 * the port's (idl_port_auth_key: flash, never a register, never printed); RAM holds the session
 * key and both nonces (sizeof(idl_auth_t); make bench-auth reports the device RAM it adds).
 */
#ifndef IDL_AUTH_H
#define IDL_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "idemlink_proto.h"

#ifndef IDL_AUTH
#define IDL_AUTH 0
#endif

#if IDL_AUTH
#include "idl_blake2s.h"

#if IDL_KEY_LEN != 32u || IDL_NONCE_LEN != 16u || IDL_AUTH_TAG_LEN != 8u
#error "idl_auth.c implements 32-byte keys, 16-byte nonces and 8-byte tags"
#endif

/* ---- provided by the integrator (IDL_AUTH=1) ---------------------------------------------- */

/** The `i`-th long-term key the device accepts now (IDL_KEY_LEN bytes, in flash or RAM the port
 *  owns): 0 the current key, 1.. older keys still accepted during a rotation window; NULL past
 *  the last. NULL for 0: the device is not keyed (it serves the first contract's frames). Read
 *  at every keyed HELLO; never copied by the core. */
const uint8_t *idl_port_auth_key(unsigned i);
/** `n` unpredictable bytes (a TRNG; not the boot epoch's source unless that is one): the
 *  device's HELLO nonce. */
void idl_port_random(uint8_t *buf, size_t n);

/* ---- the state ------------------------------------------------------------------------------ */

typedef struct {
    uint8_t has_session;
    uint8_t keyed;                   /**< the port holds a key (idl_port_auth_key(0)) */
    uint8_t key_id[4];               /**< the key of the session (the current one before), LE */
    uint8_t session[IDL_KEY_LEN];    /**< the session key (valid when has_session) */
    uint8_t nonces[2u * IDL_NONCE_LEN]; /**< the last keyed HELLO's host nonce, then ours */
} idl_auth_t;

/** A boot: no session; a device nonce drawn (the one a reply carries before any keyed HELLO;
 *  key_id is set by every HELLO); keyed if the port holds a key. Inline: one caller. */
static inline void idl_auth_init(idl_auth_t *a)
{
    a->has_session = 0u;
    a->keyed = idl_port_auth_key(0u) != NULL ? 1u : 0u;
    idl_port_random(a->nonces + IDL_NONCE_LEN, IDL_NONCE_LEN);
}

/** A HELLO's payload (version, contract hash, then the auth extension: host nonce, key id LE):
 *  1 if it names a key the device holds — a device nonce drawn (unless the host nonce is the last
 *  keyed HELLO's: the same answer again) and the session key derived from that key, both nonces,
 *  the device id as the pascal string `id` (length byte first) and the session's `address`
 *  byte (0xFF point-to-point); 0 otherwise (the reply goes unsigned, the session key stays).
 *  Sets key_id: the named key's, else the current one's. */
int idl_auth_hello(idl_auth_t *a, const uint8_t *payload, uint16_t len, const uint8_t *id,
                   uint8_t address);

/** The 32-bit id of a long-term key, as its 4 little-endian bytes: BLAKE2s-32 keyed with it over
 *  "idemlink key id v1" (protocol/auth.py key_id). Inline: the handshake is its one caller. */
static inline void idl_auth_key_id(uint8_t id[4], const uint8_t *key)
{
    static const uint8_t label[] = "idemlink key id v1";
    idl_piece_t piece;
    piece.p = label;
    piece.n = sizeof label - 1u;
    idl_blake2s(id, 4u, key, &piece, 1u);
}
#endif /* IDL_AUTH */

#endif /* IDL_AUTH_H */
