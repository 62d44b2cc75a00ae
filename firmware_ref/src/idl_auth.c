/* The keyed device's handshake: see idl_auth.h (protocol/auth.py DeviceAuth). */
#include "idl_auth.h"

#if IDL_AUTH
#include <string.h>

static const uint8_t KDF_LABEL[] = IDL_KDF_LABEL;

int idl_auth_hello(idl_auth_t *a, const uint8_t *payload, uint16_t len, const uint8_t *id,
                   uint8_t address)
{
    const uint8_t *ext = payload + 1u + IDL_CONTRACT_HASH_LEN;
    const uint8_t *key;
    idl_piece_t pieces[4];
    unsigned i;
    /* the current key's id unless the host names a key we hold (an unkeyed host's HELLO, too
     * short for the extension, names none) */
    for (i = 0; (key = idl_port_auth_key(i)) != NULL; i++) {
        uint8_t kid[4];
        idl_auth_key_id(i == 0u ? a->key_id : kid, key);
        if (len >= 1u + IDL_CONTRACT_HASH_LEN + IDL_NONCE_LEN + 4u
            && memcmp(i == 0u ? a->key_id : kid, ext + IDL_NONCE_LEN, 4u) == 0) {
            break;
        }
    }
    if (key == NULL) {
        return 0; /* no key, or another one: say which one we hold, sign nothing */
    }
    if (a->has_session == 0u || memcmp(a->nonces, ext, IDL_NONCE_LEN) != 0) {
        /* a new handshake: a new nonce (the same HELLO again gets the same answer) */
        memcpy(a->nonces, ext, IDL_NONCE_LEN);
        idl_port_random(a->nonces + IDL_NONCE_LEN, IDL_NONCE_LEN);
    }
    memcpy(a->key_id, ext + IDL_NONCE_LEN, 4u);
    pieces[0].p = KDF_LABEL;
    pieces[0].n = sizeof KDF_LABEL - 1u;
    pieces[1].p = a->nonces;
    pieces[1].n = sizeof a->nonces;
    pieces[2].p = id;
    pieces[2].n = 1u + (size_t)id[0];
    pieces[3].p = &address;
    pieces[3].n = 1u;
    idl_blake2s(a->session, IDL_KEY_LEN, key, pieces, 4u);
    a->has_session = 1u;
    return 1;
}
#else
typedef int idl_auth_unused; /* ISO C: a translation unit is never empty */
#endif
