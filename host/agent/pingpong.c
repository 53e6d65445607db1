/* The agents' self-test job: every device sends to the same local device
 * of the next host and receives from the previous one, checking every
 * byte (`meshrun agent --job pingpong`, `meshrun local --job pingpong`). */
#include "host/agent/pingpong.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "net/xport.h"
#include "proto/meshrun.pb-c.h"

#define PINGPONG_GROUP 0xfffe

static uint64_t pattern_word(int dev, long round, size_t i)
{
	uint64_t x = ((uint64_t)dev << 40) ^ ((uint64_t)round << 8) ^ 0x9e3779b97f4a7c15ull;
	x *= 0xbf58476d1ce4e5b9ull;
	return (x ^ (x >> 31)) + i * 0x94d049bb133111ebull;
}

static void fill(uint8_t *buf, size_t size, int dev, long round)
{
	size_t i, words = size / 8;
	for (i = 0; i < words; i++) {
		uint64_t w = pattern_word(dev, round, i);
		memcpy(buf + 8 * i, &w, 8);
	}
	if (size % 8) {
		uint64_t w = pattern_word(dev, round, i);
		memcpy(buf + 8 * i, &w, size % 8);
	}
}

/* Index of the first byte that differs from the pattern, or size. */
static size_t check(const uint8_t *buf, size_t size, int dev, long round)
{
	size_t i, words = size / 8;
	for (i = 0; i < words; i++) {
		uint64_t w = pattern_word(dev, round, i);
		if (memcmp(buf + 8 * i, &w, 8))
			break;
	}
	uint64_t w = pattern_word(dev, round, i);
	const uint8_t *wb = (const uint8_t *)&w;
	for (size_t b = 8 * i; b < size && b < 8 * i + 8; b++)
		if (buf[b] != wb[b - 8 * i])
			return b;
	return size;
}

/* Every device sends to the same local device of the next host and
 * receives from the previous one, rounds times, checking every byte. */
int pingpong_job(struct device_ctx *d)
{
	const struct pingpong_arg *pa = d->job_arg;
	const struct mesh *m = d->mesh;
	int H = m->num_hosts;
	int next = mesh_device_of(m, (d->host_id + 1) % H, d->local_index);
	int prev = mesh_device_of(m, (d->host_id + H - 1) % H, d->local_index);
	uint8_t *sb = malloc(pa->size ? pa->size : 1), *rb = malloc(pa->size ? pa->size : 1);
	char why[400];
	int rc = 0;
	uint64_t t0 = xport_now_ns();

	if (!sb || !rb) {
		snprintf(d->err, sizeof(d->err), "pingpong: out of memory for %zu bytes", pa->size);
		rc = -ENOMEM;
		goto out;
	}
	for (long r = 0; r < pa->rounds; r++) {
		struct xmeta meta = { .op = MESHRUN__COLL_OP__COLL_P2P, .group = PINGPONG_GROUP,
				      .seq = (uint64_t)r, .step = (uint64_t)r };
		struct xreq *rr, *sr;
		uint64_t deadline = xport_now_ns() + (uint64_t)(d->cfg->collective_timeout_s * 1e9);
		fill(sb, pa->size, d->device_id, r);
		memset(rb, 0, pa->size);
		int e = xport_irecv(d->xport, prev, d->device_id, &meta, rb, pa->size, &rr);
		if (e) {
			xport_failed(d->xport, why, sizeof(why));
			snprintf(d->err, sizeof(d->err), "pingpong round %ld: recv: %s", r,
				 why[0] ? why : strerror(-e));
			rc = -EHOSTDOWN;
			goto out;
		}
		e = xport_isend(d->xport, d->device_id, next, &meta, sb, pa->size, &sr);
		if (e) {
			xport_wait(rr, 1, why, sizeof(why));
			xport_failed(d->xport, why, sizeof(why));
			snprintf(d->err, sizeof(d->err), "pingpong round %ld: send: %s", r,
				 why[0] ? why : strerror(-e));
			rc = -EHOSTDOWN;
			goto out;
		}
		int e1 = xport_wait(sr, deadline, why, sizeof(why));
		if (e1)
			snprintf(d->err, sizeof(d->err), "pingpong round %ld: %s", r, why);
		int e2 = xport_wait(rr, deadline, why, sizeof(why));
		if (e2 && !e1)
			snprintf(d->err, sizeof(d->err), "pingpong round %ld: %s", r, why);
		if (e1 || e2) {
			rc = (e1 == -EMSGSIZE || e2 == -EMSGSIZE) ? -EMSGSIZE : -EHOSTDOWN;
			goto out;
		}
		size_t bad = check(rb, pa->size, prev, r);
		if (bad != pa->size) {
			snprintf(d->err, sizeof(d->err),
				 "pingpong round %ld: byte %zu of %zu from device %d is wrong", r, bad,
				 pa->size, prev);
			rc = -EIO;
			goto out;
		}
	}
	if (d->device_id == 0) {
		double s = (double)(xport_now_ns() - t0) / 1e9;
		printf("pingpong: %d hosts x %d devices, %ld rounds of %zu bytes: ok in %.3f s (%.3f GB/s per device)\n",
		       H, m->devices_per_host, pa->rounds, pa->size, s,
		       s > 0 ? (double)pa->size * (double)pa->rounds / s / 1e9 : 0.0);
		fflush(stdout);
	}
	if (pa->hold_s > 0) {
		struct timespec ts = { .tv_sec = (time_t)pa->hold_s,
				       .tv_nsec = (long)((pa->hold_s - (double)(time_t)pa->hold_s) * 1e9) };
		nanosleep(&ts, NULL);
	}
out:
	free(sb);
	free(rb);
	return rc;
}
