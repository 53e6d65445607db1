/* The FSDP weight window: compute-shaped copies of the weights stored
 * sharded over the mesh (all-gathered before use), and their gradients
 * until they are reduce-scattered back to the shards. It moves weights and
 * gradients and computes nothing; which layer goes where, and when, is the
 * caller's schedule.
 *
 * A group is the non-layer tensors (embedding, final norm, head: the range
 * [WIN_NONLAYER, 0)) or a range of layers [l0, l1) of at most `lcap`
 * layers. The caller holds groups in slots it numbers itself (0 ..
 * windows + 1, any slot for any group); a slot moves
 *
 *	FREE --gather_start--> GATHERING --wait--> READY --release--> FREE
 *
 * and while READY its weights can be read (win_block) and its gradients
 * accumulated, zeroed (win_zero_grads) and sent back (win_scatter_start).
 *
 * The memory is fixed at creation: one compute-shaped window of weights
 * and one of gradients for the non-layer group, `windows` + 1 weight
 * windows and `windows` + 1 gradient windows for layer groups (lcap
 * layers each), and the non-layer group's packed buffers (a gather's:
 * what it sends, this device's part, and receives, the whole group; a
 * reduce-scatter's: the whole and the part). A layer slot takes a
 * weight window when its gather goes out and lands in it (the one more
 * is for that gather: at most `windows` are READY beside it), and a
 * gradient window when it is READY. With the comm's list forms
 * (start_all_gather_v, start_reduce_scatter_v) a layer group moves in
 * place: this device's shards are copied into their blocks (by the
 * collective: the window hands it the moves) and the list of every
 * member's blocks' rows is all-gathered where the weights lie;
 * its reduce-scatter works over the same rows of its gradient window,
 * which stays with it while the slot takes the one more (the caller
 * zeroes it before writing: win_zero_grads, which leaves a block a
 * first write overwrites whole unzeroed), and this device's block is added into the
 * gradient shards when it finishes (by the collective, its moves: the
 * shards' gradients of a group in flight must not be touched until it
 * is finished, nor its weight shards written until its gather is). The non-layer group packs its
 * reduce-scatter (its gradient window is the step's), and its gather
 * while a READY slot holds it. Without the list forms every group packs;
 * a layer group's packed buffers (win_packed_numel) are allocated the
 * first time one does (-ENOMEM, with a one-line message in the comm's
 * err, when that fails). Hence the rules (programmer errors, asserted):
 * at most one READY non-layer slot and at most `windows` READY layer
 * slots; a READY layer slot's layers overlap no other READY one's.
 *
 * Gathers go out in the order they were started and are waited for in
 * that order (wait() of a slot first finishes those before it). One that
 * goes in place (every gather group as a list) goes out at once when a
 * weight window is free, beside the ones in flight; one that packs, or
 * finds no free window, is queued until none is in flight (or a window
 * is released). So a caller that starts gathers well before it waits (a
 * schedule's GATHER entries, their first use later; the update starting
 * the next step's first groups) hides them behind the compute in
 * between, and gathers started together reach the communication thread
 * together, back to back. A reduce-scatter packs the gradients,
 * or takes the slot's gradient window, on start, so the slot's gradient
 * window is free again at once; one is in flight at a time (the next
 * start finishes it), but for a layer's parts sent ahead
 * (win_scatter_parts), which go beside the ones in flight, and the
 * rest of a slot whose parts alone are in flight (win_scatter_follows):
 * up to four.
 *
 * Parts (win_set_parts, the trainer's fsdp_layer_parts): a layer
 * group's in-place gather goes as a collective a part and gather group,
 * part 0's tensors, then part 1's, ... (but a layer's second gather
 * since win_end, a backward's, which waits for all, goes whole: layers
 * below 256); win_wait_part waits for the
 * first parts alone (win_block then gives their weights, and waits for
 * a later part itself if asked for it). win_scatter_parts sends some
 * parts' gradients while the slot stays READY and keeps its gradient
 * window (the other parts' rows are still written); the slot's
 * win_scatter_start then sends the rest.
 *
 * Errors: every call returns the step's error (0 or the first hook
 * error, a negative errno), which lives in the int given to win_begin;
 * once it is set no collective starts, but the states still move, so the
 * caller's schedule runs on and win_end cleans up. */
#ifndef MESHRUN_WINDOW_H
#define MESHRUN_WINDOW_H

#include <stdbool.h>
#include <stddef.h>

#include "host/mesh/mesh.h"
#include "host/mesh/plan.h"
#include "host/model/param.h"

/* WIN_NONLAYER, WIN_MAX_PARTS, struct win_tensor and struct win_layout
 * are in host/model/param.h (types the window's rooms share). */

struct win;

/* Lays out the window for tensors t[0, n) (copied; the pointers in them
 * and lo->ctx must outlive the window) as lo says; no buffers yet. NULL
 * when out of memory or the tensors are gathered over more different
 * axis sets than it keeps groups for. */
struct win *win_new(const struct mesh *ms, int device, const struct win_tensor *t, int n,
		    const struct win_layout *lo);
/* Allocates the buffers (zeroed); params and grads are the model's one
 * allocation each, which gathers read and reduce-scatters add into.
 * 0 or -ENOMEM. */
int win_alloc(struct win *w, float *params, float *grads);
void win_free(struct win *w);
/* Floats the buffers take (whether allocated or not): every one a comm
 * with the list forms uses. */
size_t win_numel(const struct win *w);
/* Floats a layer group's packed buffers take: allocated (beyond
 * win_numel) only when a comm without the list forms packs one. */
size_t win_packed_numel(const struct win *w);
/* The slots a caller may number: 0 .. win_slots() - 1 (windows + 2). */
int win_slots(const struct win *w);

/* Cuts every layer group in parts: part[i] (0 .. WIN_MAX_PARTS - 1) for
 * each tensor, and part0[i] in layer 0 (NULL: as part; both copied), or
 * part NULL: whole (the default); the parts are 0 .. the largest given
 * (a layer whose tensors leave a part empty sends no collective for it). A layer group's gather that goes in place then goes
 * as a collective a part and gather group, part 0's first
 * (win_wait_part), and its reduce-scatter may send some parts first
 * (win_scatter_parts). Each element is summed over the same members in
 * the same order either way: the same bits. Call between steps. 0 or
 * -ENOMEM. */
int win_set_parts(struct win *w, const signed char *part, const signed char *part0);
/* After win_set_parts: the gradients of layer 0 and of layer l (-1:
 * none) are cut as partw says (a part a tensor, as win_set_parts' part;
 * NULL: as before), their weights as before (a pipeline stage's last
 * weight backward, on layer 0 or another: its reduce-scatter in finer
 * parts, sent as their gradients are written; its gather as before).
 * Each element is summed as before: the same bits. Call between steps. */
void win_set_fine(struct win *w, int l, const signed char *partw);
/* Whether a gather of a layer group (layer) or of the non-layer group
 * moves any weights: some tensor of that kind is gathered. */
bool win_moves(const struct win *w, bool layer);
/* A step begins: the collectives to use and where its error lives. */
void win_begin(struct win *w, const struct model_comm *comm, int *rc);
/* Starts all-gathering group [l0, l1) into FREE slot k (in the
 * background when the hooks allow it). */
int win_gather_start(struct win *w, int k, int l0, int l1);
/* Waits for slot k's gather (and for the queued ones before it) and
 * places the weights in a free window: k is READY. Returns at once when
 * k is READY already (a schedule's second use of a slot). */
int win_wait(struct win *w, int k);
/* Parts (win_set_parts): waits for slot k's parts 0 .. p only, when its
 * gather went in parts, else as win_wait. Then win_block gives those
 * parts' weights of k (and waits itself for a later part asked for);
 * win_wait(k) waits for every part. win_wait_first: part 0. */
int win_wait_part(struct win *w, int k, int p);
int win_wait_first(struct win *w, int k);
/* The caller is done with READY slot k's weights (a gather queued for
 * want of a free weight window may go out now). */
void win_release(struct win *w, int k);
/* Zeroes READY slot k's gradient window (its gradients accumulate): the
 * non-layer group's at once; a layer group's blocks are only marked, and
 * each is zeroed when first asked for (win_block, a reduce-scatter of it)
 * unless its first writer overwrites it whole instead (win_grad_write),
 * so a backward whose weight gradients are products writes each once
 * instead of zeroing 13 MB (llama-bench) before it. Every reader sees
 * zeros and the sums; the same bits (a write is 0 + x but for the sign
 * of a zero, and a shard's += turns -0 into +0). */
void win_zero_grads(struct win *w, int k);
/* Whether the caller may write (not add) the n floats of tensor i's
 * gradient of layer l from its block's start: the block's zeroing was
 * deferred and n covers it (it is no longer marked; the caller must
 * write it whole now). A marked block n does not cover is zeroed here
 * (false: add as always). Layer l is in a READY slot. */
bool win_grad_write(struct win *w, int i, int l, size_t n);
/* Every marked block of READY slot k is written (sleep mode's compute,
 * which writes nothing, as the model's first writes would): no zeroing. */
void win_grads_written(struct win *w, int k);
/* Floats the window has zeroed since it was made. */
size_t win_zeroed(const struct win *w);
/* Layer-group gathers started since the last win_end (a gather started
 * ahead of the step, pipe_exec_prefetch, counts in it; the non-layer group's
 * are not counted, nor any when no layer tensor is gathered): a
 * schedule's gathers per step. */
int win_gathers(const struct win *w);
/* Floats the window has copied since it was made (packing, own shards,
 * placing, adding gradients in): the copies the collectives cost (a
 * list collective's own-block moves, which it does itself, counted when
 * it starts). */
size_t win_copied(const struct win *w);
/* Starts reduce-scattering READY slot k's gradients into the gradient
 * shards (adding to them), after finishing the one before: one in
 * flight (a non-layer group's beside a layer group's:
 * win_scatter_beside; the slot's rest beside its parts sent ahead:
 * win_scatter_follows). The slot's gradient window is free again on
 * return (in place:
 * another one, holding anything: zero it before writing). */
int win_scatter_start(struct win *w, int k);
/* Parts (win_set_parts): starts reduce-scattering the parts of mask
 * `parts` (bit p: part p) of READY layer slot k's gradients not sent yet,
 * as one collective a gather group (beside the ones in flight, all
 * landing in order at the next finish, unless they are four or the
 * non-layer group's went beside them: then they land first; a rule of
 * the calls alone, so every member issues the same collectives),
 * in place over their rows of the slot's gradient window, which the
 * slot keeps: the other parts' gradients may still be written. The
 * slot's win_scatter_start then sends the parts not sent. Does nothing
 * without parts, for the non-layer group, or when the comm has no list
 * form. win_scatter_first: the last part (the feed-forward block's). */
int win_scatter_parts(struct win *w, int k, unsigned parts);
int win_scatter_first(struct win *w, int k);
/* Whether READY slot k's reduce-scatter would go out beside the one in
 * flight instead of after it: k is the non-layer group, the one in
 * flight a layer group's (the step's last two: layer 0's and the
 * embedding's), the comm starts them asynchronously. Then
 * win_scatter_start does not wait, and the next win_scatter_finish
 * finishes both, the layer group's first. */
bool win_scatter_beside(const struct win *w, int k);
/* Whether READY layer slot k's win_scatter_start sends the parts not
 * sent yet beside its parts sent ahead (win_scatter_parts), which are
 * all that is in flight, instead of finishing them first: a rule of the
 * calls alone (the same on every member); all land in order at the next
 * win_scatter_finish. */
bool win_scatter_follows(const struct win *w, int k);
/* Waits for the reduce-scatters in flight, if any, and adds them in. */
int win_scatter_finish(struct win *w);
/* The step ends: waits for whatever is still in flight (after a failure;
 * what it brings is dropped) and frees every slot. */
int win_end(struct win *w);

/* Test hook: fills every layer window no slot holds, weights and
 * gradients, with NaN (call between steps): what a schedule reads without
 * gathering or zeroing it first turns the loss into NaN. A window a slot
 * holds is not idle: a gather started before the step lands in it. */
void win_poison(struct win *w);

/* The compute-shaped weights (or gradients) of gathered tensor i for
 * layer l (ignored for a non-layer tensor): the READY slot holding it. */
float *win_block(struct win *w, bool grads, int i, int l);

#endif
