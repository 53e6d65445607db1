/* A model of a running link's receive side, for the fuzz targets, around
 * the real code: every check is net/wire_check.c's (the same functions
 * recv.c's handlers call: sequence numbers, which bodies a running link
 * takes, chunk and recv_ready ownership and fragment order, Done/Abort
 * codes), and a chunk's payload lands through the real xport_remote_data /
 * xport_land_stream into buffers of the exact posted size, so a check
 * missing shows up under ASan. What is modelled: the link's receive state
 * (recv.c keeps it in struct link, which needs a live net), the send side
 * (a send "goes out" by reading its buffer) and the job's failure.
 *
 * The job: 4 devices, 0-1 on host 0 (the peer), 2-3 on host 1 (us). Posted
 * when the model starts: receives 0->2 (LM_RECV0_BYTES, tag LM_TAG(0)) and
 * 1->3 summing into float32 (LM_RECV1_BYTES, tag LM_TAG(1)), sends 2->0
 * (eager) and 3->1 (waits for its RecvReady). Eager data up to
 * LM_EAGER_MAX bytes is staged within LM_EAGER_CREDIT. */
#ifndef MESHRUN_FUZZ_LINK_MODEL_H
#define MESHRUN_FUZZ_LINK_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "net/frame.h"
#include "proto/meshrun.pb-c.h"

#define LM_GROUP 1
#define LM_SEQ 2
#define LM_TAG(chunk) (((uint64_t)LM_GROUP << 48) | ((uint64_t)LM_SEQ << 16) | (chunk))
#define LM_RECV0_BYTES 64
#define LM_RECV1_BYTES 256
#define LM_SEND_EAGER_BYTES 32  /* 2->0, tag LM_TAG(2): goes out eagerly */
#define LM_SEND_BYTES 256       /* 3->1, tag LM_TAG(3): waits for its RecvReady */
#define LM_EAGER_MAX 128
#define LM_EAGER_CREDIT 512
#define LM_NUM_HOSTS 2
#define LM_HOST_ID 1
#define LM_PEER 0
#define LM_CONFIG_HASH_BYTE 0xab /* the config hash is 32 bytes of this */
#define LM_JOB_ID 0x1234567890abcdefull
#define LM_TX_SEQ 16             /* frames the model has sent: the highest ack it takes */
#define LM_ADDR_MAX 128          /* sizeof(struct peer.addr) in net/net_int.h */

struct lm;

struct lm *lm_new(void);
/* A control frame's header that passed frame_parse_header (no payload):
 * the sequence check (recovery on), then lm_body. 0, or the negative errno
 * of the check that failed (recv.c would call link_bad_frame: the link is
 * lost, feed it nothing more), with the reason in why. */
int lm_frame(struct lm *m, const Meshrun__Frame *f, char *why, size_t whylen);
/* The body of a control frame whose sequence number passed: what recv.c's
 * dispatch does with it on a running link. 0 or a negative errno. */
int lm_body(struct lm *m, const Meshrun__Frame *f, char *why, size_t whylen);
/* A data frame's header that passed frame_parse_data, carrying payload_len
 * bytes to follow: the sequence check, then lm_data_body. As lm_frame. */
int lm_data(struct lm *m, const struct frame_data *d, uint64_t payload_len, char *why,
	    size_t whylen);
/* What recv.c's data_header_done does on a running link with a data frame
 * whose sequence number passed: its riding RecvReady, then the chunk. */
int lm_data_body(struct lm *m, const struct frame_data *d, uint64_t payload_len, char *why,
		 size_t whylen);
/* Part of the current frame's payload (as link_read reads it). */
void lm_payload(struct lm *m, const uint8_t *p, size_t n);
/* The current frame's payload is all in. */
void lm_payload_done(struct lm *m);
/* Fails what is still pending, waits every posted request once, frees. */
void lm_free(struct lm *m);

#endif
