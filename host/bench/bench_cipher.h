/* `meshrun bench cipher`: what sealing and opening our TLS records costs
 * on this CPU, for each implementation this build has (net/aead.h). */
#ifndef MESHRUN_BENCH_CIPHER_H
#define MESHRUN_BENCH_CIPHER_H

#include <stddef.h>

/* Prints, for AES-128-GCM and AES-256-GCM and each implementation, the
 * seal and open rates in GB/s of the calling thread's CPU time over about
 * `seconds` each, on records of `bytes` bytes with a 5-byte AAD (a TLS
 * record's header); then which implementation tls_cipher_impl: auto
 * takes. 0, or -ENOMEM (message printed). */
int bench_cipher_run(size_t bytes, double seconds);

#endif
