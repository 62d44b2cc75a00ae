/**
 * @file idl_auth.h
 * @brief The keyed device's side of authenticated sessions (issue 23, docs/SECURITY.md): the
 *        rules of protocol/auth.py DeviceAuth, byte for byte (the handshake runs inside the
 *        session, idl_session.c, where the HELLO and its reply lie; the MAC in the frame codec,
 *        idl_frame.c); its state and the port's hooks. Compiled in with IDL_AUTH=1.
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
 * key and both nonces (sizeof(idl_auth_t)), the session's state byte and signing key pointer,
 * the decoder's key pointer and the larger TX buffer: make bench-auth reports the device RAM it
 * adds.
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
#error "the handshake (idl_session.c) and the MAC (idl_frame.c) implement 32-byte keys, \
16-byte nonces and 8-byte tags"
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

/** The label of a key id's message (protocol/auth.py KEY_ID_LABEL). */
#define IDL_KEY_ID_LABEL "idemlink key id v1"

/** A keyed device's keys and nonces (idl_session_t.auth, between the window and the replay cache:
 *  the cheapest offsets measured; the session's `keyed` says which of them are valid). */
typedef struct {
    uint8_t nonces[2u * IDL_NONCE_LEN]; /**< the last keyed HELLO's host nonce, then ours */
    uint8_t session[IDL_KEY_LEN];    /**< the session key (valid when the session's keyed is 2) */
} idl_auth_t;

/** The 32-bit id of a long-term key, as its 4 little-endian bytes: BLAKE2s-32 keyed with it over
 *  IDL_KEY_ID_LABEL (protocol/auth.py key_id). For tests and tools: the session computes it
 *  in its handshake (idl_session.c). */
static inline void idl_auth_key_id(uint8_t id[4], const uint8_t *key)
{
    static const uint8_t label[] = IDL_KEY_ID_LABEL;
    idl_piece_t piece;
    piece.p = label;
    piece.n = sizeof label - 1u;
    (void)idl_blake2s(id, 4u, key, &piece, 1u);
}
#endif /* IDL_AUTH */

#endif /* IDL_AUTH_H */
