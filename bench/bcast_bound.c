/* The bound for a 16 MiB broadcast between two hosts of one device each
 * (issue 19): the root encrypts, the other host decrypts, and on two cores
 * the two can run at once. Measures, for BYTES (default 16 MiB) cut in
 * 16 KiB records (TLS's largest), each ROUNDS times, the best of them:
 *   enc      AES-128-GCM encrypt alone, one thread
 *   dec      AES-128-GCM decrypt alone, one thread
 *   enc||dec both at once, one thread each (the cipher's bound)
 *   tcp      plaintext loopback TCP, one thread sends, one receives
 *            (the kernel's copies)
 *   pipe     what a broadcast could be: one thread encrypts each record
 *            and send()s it, the other recv()s and decrypts it (the bound
 *            the broadcast is measured against)
 * Wall ms per BYTES and GB/s, plus the process's CPU ms per BYTES (clock-
 * free beside the wall figure). No meshrun code: OpenSSL EVP directly.
 * build: cc -O2 -pthread -o /tmp/bcast_bound bench/bcast_bound.c -lcrypto
 * usage: /tmp/bcast_bound [BYTES [ROUNDS]] */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define REC 16384
#define TAG 16

static size_t bytes = 16u << 20;
static uint8_t *plain, *cipher, *back;
static const uint8_t key[16] = { 1, 2, 3 }, iv0[12] = { 4, 5, 6 };

static double wall(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double cpu(void)
{
	struct rusage r;
	getrusage(RUSAGE_SELF, &r);
	return (double)(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
	       (double)(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

static void die(const char *what)
{
	fprintf(stderr, "bcast_bound: %s failed\n", what);
	exit(1);
}

/* one record, in place of TLS 1.3's: a fresh nonce per record, 16-byte tag */
static void seal(EVP_CIPHER_CTX *c, size_t i, const uint8_t *in, uint8_t *out, size_t n)
{
	uint8_t iv[12];
	int len;
	memcpy(iv, iv0, 12);
	memcpy(iv + 4, &i, sizeof(i));
	if (!EVP_EncryptInit_ex(c, NULL, NULL, NULL, iv) || !EVP_EncryptUpdate(c, out, &len, in, (int)n) ||
	    !EVP_EncryptFinal_ex(c, out + len, &len) ||
	    !EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, TAG, out + n))
		die("encrypt");
}

static void open_rec(EVP_CIPHER_CTX *c, size_t i, const uint8_t *in, uint8_t *out, size_t n)
{
	uint8_t iv[12];
	int len;
	memcpy(iv, iv0, 12);
	memcpy(iv + 4, &i, sizeof(i));
	if (!EVP_DecryptInit_ex(c, NULL, NULL, NULL, iv) || !EVP_DecryptUpdate(c, out, &len, in, (int)n) ||
	    !EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, TAG, (void *)(in + n)) ||
	    EVP_DecryptFinal_ex(c, out + len, &len) <= 0)
		die("decrypt (tag)");
}

static EVP_CIPHER_CTX *ctx(int enc)
{
	EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
	if (!c || !EVP_CipherInit_ex(c, EVP_aes_128_gcm(), NULL, key, iv0, enc))
		die("cipher init");
	return c;
}

static size_t nrec(void) { return (bytes + REC - 1) / REC; }
static size_t rlen(size_t i) { return bytes - i * REC < REC ? bytes - i * REC : REC; }

static void *enc_all(void *arg)
{
	(void)arg;
	EVP_CIPHER_CTX *c = ctx(1);
	for (size_t i = 0; i < nrec(); i++)
		seal(c, i, plain + i * REC, cipher + i * (REC + TAG), rlen(i));
	EVP_CIPHER_CTX_free(c);
	return NULL;
}

static void *dec_all(void *arg)
{
	(void)arg;
	EVP_CIPHER_CTX *c = ctx(0);
	for (size_t i = 0; i < nrec(); i++)
		open_rec(c, i, cipher + i * (REC + TAG), back + i * REC, rlen(i));
	EVP_CIPHER_CTX_free(c);
	return NULL;
}

static void *dec_other(void *arg)
{
	/* decrypts a second, already sealed copy, so enc||dec share nothing */
	uint8_t *src = arg;
	EVP_CIPHER_CTX *c = ctx(0);
	for (size_t i = 0; i < nrec(); i++)
		open_rec(c, i, src + i * (REC + TAG), back + i * REC, rlen(i));
	EVP_CIPHER_CTX_free(c);
	return NULL;
}

static int pair[2];
static int mode_pipe;

static void *rx(void *arg)
{
	(void)arg;
	EVP_CIPHER_CTX *c = mode_pipe ? ctx(0) : NULL;
	uint8_t *rec = malloc(REC + TAG);
	for (size_t i = 0; i < nrec(); i++) {
		size_t want = rlen(i) + (mode_pipe ? TAG : 0), got = 0;
		while (got < want) {
			ssize_t k = recv(pair[1], rec + got, want - got, 0);
			if (k <= 0)
				die("recv");
			got += (size_t)k;
		}
		if (mode_pipe)
			open_rec(c, i, rec, back + i * REC, rlen(i));
		else
			memcpy(back + i * REC, rec, rlen(i));
	}
	free(rec);
	EVP_CIPHER_CTX_free(c);
	return NULL;
}

static void tx(void)
{
	EVP_CIPHER_CTX *c = mode_pipe ? ctx(1) : NULL;
	uint8_t *rec = malloc(REC + TAG);
	for (size_t i = 0; i < nrec(); i++) {
		size_t n = rlen(i);
		const uint8_t *src = plain + i * REC;
		if (mode_pipe) {
			seal(c, i, src, rec, n);
			src = rec;
			n += TAG;
		}
		for (size_t off = 0; off < n;) {
			ssize_t k = send(pair[0], src + off, n - off, 0);
			if (k <= 0)
				die("send");
			off += (size_t)k;
		}
	}
	free(rec);
	EVP_CIPHER_CTX_free(c);
}

static void tcp_pair(void)
{
	int l = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof(a);
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 1) ||
	    getsockname(l, (struct sockaddr *)&a, &al))
		die("listen");
	pair[0] = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(pair[0], (struct sockaddr *)&a, sizeof(a)))
		die("connect");
	pair[1] = accept(l, NULL, NULL);
	close(l);
}

int main(int argc, char **argv)
{
	int rounds = 5;
	if (argc > 1)
		bytes = strtoull(argv[1], NULL, 0);
	if (argc > 2)
		rounds = atoi(argv[2]);
	size_t cb = nrec() * (REC + TAG);
	plain = malloc(bytes);
	back = malloc(bytes);
	cipher = malloc(cb);
	uint8_t *cipher2 = malloc(cb);
	if (!plain || !back || !cipher || !cipher2)
		die("malloc");
	for (size_t i = 0; i < bytes; i++)
		plain[i] = (uint8_t)(i * 131 + 7);
	memset(back, 0, bytes);
	enc_all(NULL);
	memcpy(cipher2, cipher, cb);
	tcp_pair();
	const char *names[] = { "enc", "dec", "enc||dec", "tcp", "pipe" };
	double bw[5], bc[5];
	for (int m = 0; m < 5; m++)
		bw[m] = bc[m] = 1e9;
	for (int r = 0; r < rounds; r++)
		for (int m = 0; m < 5; m++) {
			pthread_t t;
			double w0 = wall(), c0 = cpu();
			if (m == 0)
				enc_all(NULL);
			else if (m == 1)
				dec_all(NULL);
			else if (m == 2) {
				pthread_create(&t, NULL, dec_other, cipher2);
				enc_all(NULL);
				pthread_join(t, NULL);
			} else {
				mode_pipe = m == 4;
				pthread_create(&t, NULL, rx, NULL);
				tx();
				pthread_join(t, NULL);
			}
			double w = wall() - w0, c = cpu() - c0;
			if (w < bw[m])
				bw[m] = w;
			if (c < bc[m])
				bc[m] = c;
			if (m >= 1 && memcmp(back, plain, bytes))
				die("check of what came back");
			memset(back, 0, bytes);
		}
	printf("# %zu bytes in %d-byte records, best of %d rounds\n", bytes, REC, rounds);
	printf("# %-9s %9s %8s %9s\n", "what", "wall_ms", "GB/s", "cpu_ms");
	for (int m = 0; m < 5; m++)
		printf("  %-9s %9.2f %8.2f %9.2f\n", names[m], bw[m] * 1e3, (double)bytes / bw[m] / 1e9,
		       bc[m] * 1e3);
	return 0;
}
