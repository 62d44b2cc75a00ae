/* The keyed device's handshake: see idl_auth.h (protocol/auth.py DeviceAuth). */
#include "idl_auth.h"

#if IDL_AUTH
#include <string.h>

static const uint8_t KEY_ID_LABEL[] = "idemlink key id v1";
static const uint8_t KDF_LABEL[] = IDL_KDF_LABEL;

uint32_t idl_auth_key_id(const uint8_t *key)
{
    idl_piece_t label = { KEY_ID_LABEL, sizeof KEY_ID_LABEL - 1u };
    uint8_t id[4];
    idl_blake2s(id, 4u, key, &label, 1u);
    return (uint32_t)id[0] | ((uint32_t)id[1] << 8) | ((uint32_t)id[2] << 16)
           | ((uint32_t)id[3] << 24);
}

void idl_auth_tag(uint8_t tag[IDL_AUTH_TAG_LEN], const uint8_t *key, uint8_t dir,
                  const uint8_t *p, size_t n)
{
    idl_piece_t pieces[2];
    pieces[0].p = &dir;
    pieces[0].n = 1u;
    pieces[1].p = p;
    pieces[1].n = n;
    idl_blake2s(tag, IDL_AUTH_TAG_LEN, key, pieces, 2u);
}

void idl_auth_init(idl_auth_t *a)
{
    const uint8_t *key = idl_port_auth_key(0u);
    a->has_session = 0u;
    a->keyed = key != NULL ? 1u : 0u;
    /* the nonce a reply carries before any keyed HELLO (key_id: set by every HELLO) */
    idl_port_random(a->nonces + IDL_NONCE_LEN, IDL_NONCE_LEN);
}

const uint8_t *idl_auth_hello(idl_auth_t *a, const uint8_t *payload, uint16_t len)
{
    const uint8_t *ext = payload + 1u + IDL_CONTRACT_HASH_LEN;
    const uint8_t *key = NULL;
    uint32_t kid;
    unsigned i;
    /* the current key's id unless the host names a key we hold */
    a->key_id = idl_auth_key_id(idl_port_auth_key(0u));
    if (len < 1u + IDL_CONTRACT_HASH_LEN + IDL_NONCE_LEN + 4u) {
        return NULL; /* an unkeyed host's HELLO */
    }
    kid = (uint32_t)ext[16] | ((uint32_t)ext[17] << 8) | ((uint32_t)ext[18] << 16)
          | ((uint32_t)ext[19] << 24);
    for (i = 0; (key = idl_port_auth_key(i)) != NULL; i++) {
        if (idl_auth_key_id(key) == kid) {
            break;
        }
    }
    if (key == NULL) {
        return NULL; /* another key: say which one we hold, sign nothing */
    }
    if (a->has_session == 0u || memcmp(a->nonces, ext, IDL_NONCE_LEN) != 0) {
        /* a new handshake: a new nonce (the same HELLO again gets the same answer) */
        memcpy(a->nonces, ext, IDL_NONCE_LEN);
        idl_port_random(a->nonces + IDL_NONCE_LEN, IDL_NONCE_LEN);
    }
    a->key_id = kid;
    return key;
}

void idl_auth_derive(idl_auth_t *a, const uint8_t *key, const uint8_t *id, uint8_t address)
{
    idl_piece_t pieces[4];
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
}
#else
typedef int idl_auth_unused; /* ISO C: a translation unit is never empty */
#endif
