/* Run configuration: one table of keys with types and defaults, loaded from
 * YAML (libyaml) and then `key=value` overrides. configs/base.yml lists every
 * key with its default; cfg_defaults() and base.yml must agree (tested). */
#ifndef MESHRUN_CONFIG_H
#define MESHRUN_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CFG_MAX_LIST 64
#define CFG_STR 256

/* The mesh axes in MaxText order, written once. Each row is
 * M(X, enum, axis name, key stem, default): the axis has two size keys,
 * ici_<stem>_parallelism (devices within a host) and dcn_<stem>_parallelism
 * (hosts), both defaulting to `default`; -1 = fill in from the run's shape
 * (the data axis by default: all devices of a host, all hosts). X is passed
 * through to M so that CFG_KEYS can list the keys in its own form. */
#define MESH_AXES(M, X) \
	M(X, AX_DATA,      data,             data,             "-1") \
	M(X, AX_STAGE,     stage,            pipeline,         "1") \
	M(X, AX_FSDP,      fsdp,             fsdp,             "1") \
	M(X, AX_FSDP_T,    fsdp_transpose,   fsdp_transpose,   "1") \
	M(X, AX_SEQUENCE,  sequence,         sequence,         "1") \
	M(X, AX_CONTEXT,   context,          context,          "1") \
	M(X, AX_TENSOR,    tensor,           tensor,           "1") \
	M(X, AX_TENSOR_T,  tensor_transpose, tensor_transpose, "1") \
	M(X, AX_EXPERT,    expert,           expert,           "1")

#define MESH_AXIS_ENUM(X, e, name, stem, def) e,
enum mesh_axis { MESH_AXES(MESH_AXIS_ENUM, ) AX_COUNT };
#undef MESH_AXIS_ENUM
extern const char *const mesh_axis_names[AX_COUNT];

struct cfg_list {
	int n;
	char item[CFG_MAX_LIST][CFG_STR];
};

/* X(type, name, default-as-string, help). Types: INT, FLOAT, BOOL, STR, LIST.
 * `hash` = 0 marks keys that may differ between hosts (not in config hash). */
#define CFG_KEYS(X) \
	/* --- cluster --- */ \
	X(STR,   coordinator_address, "127.0.0.1:7000", 1, "host:port of host 0's rendezvous listener") \
	X(LIST,  hosts, "", 1, "per-host data addresses host:port (index = host id); empty: 127.0.0.1 with ports after coordinator's") \
	X(STR,   certs_dir, "certs", 0, "directory with ca.pem, host<N>.pem, host<N>.key (deploy/gen-certs.sh)") \
	X(FLOAT, heartbeat_interval_s, "0.5", 1, "seconds between heartbeats on every link") \
	X(FLOAT, heartbeat_timeout_s, "10", 1, "a peer silent this long is dead") \
	X(FLOAT, connect_timeout_s, "30", 1, "rendezvous and link set-up deadline") \
	X(FLOAT, collective_timeout_s, "600", 1, "deadline for one collective") \
	X(INT,   segment_bytes, "1048576", 1, "ring segment size in bytes") \
	X(INT,   max_frame_bytes, "67108864", 1, "largest frame payload accepted") \
	X(INT,   eager_max_bytes, "65536", 1, "a message to another host of at most this many bytes goes out without waiting for the receiver's RecvReady; each host stages at most 8x this from each peer; 0: every message waits") \
	X(INT,   tls_key_update_bytes, "34359738368", 1, "a link renews its TLS sending key (TLS 1.3 KeyUpdate) after this many bytes; AES-GCM is good for ~2^24.5 records (~390 GB) per key") \
	X(LIST,  faults, "", 0, "fault injection for drills: specs like close:link=0-1:frame=40, delay:link=0-2:ms=5, corrupt:link=1-2:frame=40, blackhole:link=0-1:frame=10:s=1, drop:link=0-1:frame=40, halfopen:link=0-1:frame=40:dir=both, kill:host=1:step=3, stop:host=1:step=3 (docs/failures.md)") \
	X(INT,   replay_buffer_bytes, "67108864", 1, "per link, bytes of sent frames kept until the peer acknowledges them, so a broken link is redialed and resumed (a sender waits when full); 0: no recovery, a broken link fails the job") \
	X(FLOAT, link_reconnect_timeout_s, "30", 1, "a broken link not back within this many seconds fails the job") \
	X(FLOAT, link_silence_s, "0", 1, "a link that has heard nothing this long while up is taken for half-open: its connection is dropped and the lower id redials (resume with replay, as after a reset); a peer that does not answer the new connection is lost at heartbeat_timeout_s; 0: 0.4 x heartbeat_timeout_s; must lie between heartbeat_interval_s and heartbeat_timeout_s") \
	X(INT,   poll_spin_us, "200", 0, "a device thread waiting for a message from another host reads its link itself this many microseconds before it sleeps (the link's stream thread wakes it then); 0: it sleeps at once") \
	X(INT,   p2p_handoff_bytes, "131072", 0, "a point-to-point message (a pipeline's activation or gradient) of more than this many bytes is sealed and written by its link's stream thread: the sending device thread queues it and goes on; 0: the sending thread seals and writes every message it can itself (up to max_send_bytes a turn)") \
	X(INT,   max_send_bytes, "1048576", 0, "the bytes a thread writes on a link in one turn before it pushes them to the wire and looks at its queues again") \
	X(STR,   tls_records, "own", 0, "own | openssl: who writes and reads a link's TLS 1.3 records after OpenSSL's handshake: meshrun's record layer (the same records, sealed by tls_cipher_impl; up to max_send_bytes a send(), 256 KiB a recv(), decrypted into the posted buffer) or OpenSSL's (one system call a 16 KiB record)") \
	X(STR,   tls_cipher_impl, "auto", 0, "auto | ipsec-mb | openssl: who seals and opens the AES-GCM of meshrun's own TLS records (tls_records: own): Intel's ipsec-mb, with the VAES/AVX-512 code that Debian 12's OpenSSL 3.0 lacks (about 3x its speed on a Zen 4), or OpenSSL's EVP; auto: ipsec-mb when this build has it. The bytes on the wire are the same either way") \
	X(INT,   tcp_notsent_lowat_bytes, "262144", 0, "TCP_NOTSENT_LOWAT on every link's socket: the kernel takes more bytes only while fewer than this wait unsent, so a control frame never queues behind more (on a slow link, megabytes are seconds); 0: the kernel's default, no limit") \
	X(INT,   link_streams, "1", 1, "TLS connections per host pair; an agent runs that many stream threads, thread k reading connection k of every pair; a host's messages go round them, so the cipher can run on more cores than there are peers") \
	X(BOOL,  coll_two_level, "true", 1, "all_gather, reduce_scatter and all_reduce on a group of H >= 2 hosts x D >= 2 devices each (uniform, host-major) run in two levels, within each host then across hosts among devices of one local index: (H-1)/H of the buffer leaves a host instead of (n-1)/n, in H-1 hops instead of n-1; other groups keep the flat ring; changes those groups' summation order (docs/collectives.md)") \
	/* --- mesh: every ici_* key, then every dcn_* key, from MESH_AXES --- */ \
	MESH_AXES(CFG_ICI_KEY, X) \
	MESH_AXES(CFG_DCN_KEY, X) \
	/* --- sharding (docs/sharding.md) --- */ \
	X(LIST, logical_axis_rules, \
		"vocab=tensor," \
		"embed=fsdp|fsdp_transpose|tensor_transpose|context|expert," \
		"embed_moe=fsdp|fsdp_transpose|tensor_transpose|context," \
		"mlp=fsdp_transpose|tensor,mlp_moe=fsdp_transpose|tensor,heads=tensor," \
		"q_heads=tensor,kv_heads=tensor,kv=," \
		"q_lora=fsdp|fsdp_transpose|context|expert,kv_lora=fsdp|fsdp_transpose|context|expert," \
		"q_lora_up_proj=,kv_lora_up_proj=," \
		"norm=,exp=expert,layers=stage," \
		"activation_batch=data|fsdp|fsdp_transpose|expert," \
		"activation_length=context,activation_embed=tensor_transpose," \
		"activation_mlp=tensor,activation_heads=tensor,activation_vocab=tensor," \
		"activation_exp=expert,activation_stage=stage", \
	  1, "logical=axis1|axis2|... in order; the first rule that fits a dimension wins; logical= replicates") \
	X(STR,  custom_mesh_and_rule, "", 1, "\"\" or shard-exp-on-fsdp") \
	/* --- pipeline (MaxText names); stages = ici_ x dcn_pipeline_parallelism --- */ \
	X(INT,  num_pipeline_microbatches, "-1", 1, "M: microbatches per step, a multiple of the stages; -1: the stages (2 x stages with pipeline_delay_activation_forwarding)") \
	X(INT,  num_layers_per_pipeline_stage, "1", 1, "layers one stage runs back to back in one iteration") \
	X(INT,  num_pipeline_repeats, "-1", 1, "R: times a microbatch circles the stages; -1: pipelined layers / (stages x num_layers_per_pipeline_stage)") \
	X(INT,  pipeline_parallel_layers, "-1", 1, "decoder layers in the pipeline, the rest run data-parallel over stage; -1: all (MoE models: all MoE layers, the dense ones run before)") \
	X(BOOL, pipeline_delay_activation_forwarding, "false", 1, "a stage takes its input two iterations after the previous stage made it, so sends overlap compute; doubles the bubble") \
	X(BOOL, pipeline_fsdp_ag_once, "false", 1, "gather all of a stage's weights (every repeat) once per step and reduce-scatter once at the end: repeats x weight memory") \
	X(STR,  fsdp_layer_parts, "auto", 1, "auto | true | false: FSDP without a pipeline, or with zbv or zb_h1 of one layer a chunk (auto: wherever it applies; true: refused elsewhere): gather and reduce-scatter each layer in two parts, its attention block and its feed-forward block, so the feed-forward block's gather hides under the attention block's forward and its reduce-scatter under the attention block's backward, and layer 0's grouped-query attention in its four projections where each is large enough (docs/training-step.md); the same bits") \
	X(BOOL, pipeline_fsdp_ag_per_repeat, "false", 1, "two gathered weight slots per stage; the next repeat's weights are gathered one repeat ahead") \
	X(STR,  pipeline_schedule, "circular", 1, "circular | gpipe | 1f1b | interleaved_1f1b | zb_h1 | zbv: the order of a step's forwards and backwards (docs/pipeline.md)") \
	X(INT,  pipeline_interleave_group, "-1", 1, "interleaved_1f1b: g, microbatches one chunk runs before the stage moves to its next chunk (Megatron-LM's microbatch_group_size_per_vp_stage), in [stages, num_pipeline_microbatches], the last group (microbatches mod g) 0 or >= the stages; -1: the stages (the paper's order); a larger g gives each chunk change slack for the transfers, for (chunks - 1)(g - stages) more saved chunk inputs a stage (docs/pipeline.md)") \
	X(BOOL, pipeline_recompute, "true", 1, "a backward recomputes its chunk's forward from the chunk's saved input; false: the forward keeps every layer's activations until the backward") \
	X(BOOL, pipeline_fill_waits, "false", 1, "zb_h1, zbv: at a receive that has not arrived, run the next weight gradient (W) the device owes first, where that moves no collective (no FSDP-gathered layer weights); false: table order") \
	X(BOOL, pipeline_update_ahead, "false", 1, "a pipeline stage whose list ends before another's and runs a forward before its first exchange (zbv's stage 0) updates its weights without waiting for the step's global gradient norm, as if clipping scales nothing, and checks at the next step's first exchange: when clipping did scale the gradients it redoes the update and the next step's start; the same bits either way (docs/training-step.md, \"Updating ahead\")") \
	X(STR,  pipeline_compute, "model", 1, "model | sleep: sleep runs every compute action of the step's table as a sleep of its time (pipeline_sleep_ms) instead of the model, everything else real (agents, links, sends and receives at the model's sizes, the window's gathers, the executor): to measure the executor and the transport against the bubble formulas; no loss, no checkpoints (docs/pipeline.md)") \
	X(STR,  pipeline_sleep_ms, "20,20,20", 1, "pipeline_compute=sleep: F,I,W[,O] milliseconds of a forward, input-gradient and weight-gradient backward of one microbatch through one chunk (B = I + W; the counting forward F), O of each owner action (embed, head, embed_back; default 0)") \
	/* --- model (MaxText names) --- */ \
	X(INT,   base_emb_dim, "256", 1, "d_model") \
	X(INT,   base_num_query_heads, "4", 1, "") \
	X(INT,   base_num_kv_heads, "4", 1, "grouped-query heads (divides query heads)") \
	X(INT,   head_dim, "0", 1, "0: base_emb_dim / base_num_query_heads") \
	X(INT,   base_mlp_dim, "704", 1, "SwiGLU hidden size of dense layers") \
	X(INT,   base_num_decoder_layers, "2", 1, "") \
	X(INT,   vocab_size, "256", 1, "tokens of the vocabulary; text data (bytes) needs at least 256") \
	X(INT,   max_target_length, "128", 1, "sequence length") \
	X(FLOAT, normalization_layer_epsilon, "1e-05", 1, "RMSNorm epsilon") \
	X(FLOAT, rope_max_timescale, "10000", 1, "RoPE theta") \
	X(BOOL,  logits_via_embedding, "false", 1, "tie output projection to the embedding") \
	X(INT,   num_experts, "1", 1, "1: dense model") \
	X(INT,   num_experts_per_tok, "1", 1, "top-k") \
	X(INT,   first_num_dense_layers, "0", 1, "leading dense layers of an MoE model") \
	X(INT,   shared_experts, "0", 1, "shared experts per MoE layer") \
	X(INT,   base_moe_mlp_dim, "0", 1, "hidden size of one expert (0: base_mlp_dim)") \
	X(STR,   routed_score_func, "softmax", 1, "softmax | sigmoid") \
	X(BOOL,  routed_bias, "false", 1, "sigmoid router selection bias (e_score_correction_bias)") \
	X(FLOAT, routed_bias_update_rate, "0", 1, "DeepSeek aux-loss-free bias update speed (0: off)") \
	X(FLOAT, routed_scaling_factor, "1", 1, "MoE: scales the routed experts' gate weights") \
	X(BOOL,  norm_topk_prob, "true", 1, "renormalise the top-k weights") \
	X(FLOAT, load_balance_loss_weight, "0.01", 1, "MoE: weight of the auxiliary load-balancing loss (0: off)") \
	X(INT,   n_routing_groups, "-1", 1, "DeepSeek-V3 group-limited routing: expert groups (-1: none)") \
	X(INT,   topk_routing_group, "-1", 1, "groups whose experts compete for each token (-1: all)") \
	/* --- attention (MaxText names; docs/deepseek.md) --- */ \
	X(STR,   attention_type, "global", 1, "global (grouped-query attention) | mla (multi-head latent attention)") \
	X(INT,   q_lora_rank, "0", 1, "mla: rank of the query down-projection (0: a plain q_proj)") \
	X(INT,   kv_lora_rank, "512", 1, "mla: rank of the compressed kv") \
	X(INT,   qk_nope_head_dim, "128", 1, "mla: per-head query/key dims without rotary embedding") \
	X(INT,   qk_rope_head_dim, "64", 1, "mla: per-head query/key dims with rotary embedding (the key's are shared by all heads)") \
	X(INT,   v_head_dim, "128", 1, "mla: per-head value dims") \
	X(STR,   rope_type, "default", 1, "default | yarn") \
	X(FLOAT, rope_factor, "40", 1, "yarn: context extension factor") \
	X(INT,   original_max_position_embeddings, "4096", 1, "yarn: the context length the model was trained at first") \
	X(FLOAT, beta_fast, "32", 1, "yarn: rotations above which frequencies are kept") \
	X(FLOAT, beta_slow, "1", 1, "yarn: rotations below which frequencies are interpolated") \
	X(FLOAT, mscale, "1", 1, "yarn: attention factor mscale") \
	X(FLOAT, mscale_all_dim, "0", 1, "yarn: mscale_all_dim (0: unset)") \
	X(BOOL,  use_batch_split_schedule, "false", 1, "DeepSeek batch split schedule: the halves batch_split_factor cuts run staggered so one half's expert all-to-all overlaps the other's compute (false: one half after the other, the same bits)") \
	X(INT,   batch_split_factor, "1", 1, "parts a device's batch is cut into, each with its own products, whatever the schedule: 2 (1: unsplit; docs/deepseek.md#batch-split)") \
	X(FLOAT, init_std, "0.02", 1, "") \
	X(INT,   init_weights_seed, "0", 1, "") \
	X(STR,   load_parameters_path, "", 1, "start from the weights in this directory: a meshrun checkpoint or a Hugging Face llama / deepseek_v3 directory") \
	/* --- training --- */ \
	X(INT,   per_device_batch_size, "4", 1, "rows a device trains on each step; the global batch is this x every device of the mesh") \
	X(INT,   steps, "20", 1, "training steps") \
	X(STR,   opt_type, "adamw", 1, "adamw | muon") \
	X(FLOAT, learning_rate, "0.003", 1, "peak learning rate") \
	X(FLOAT, warmup_steps_fraction, "0.1", 1, "linear warm-up over this fraction of learning_rate_schedule_steps, then a cosine decay") \
	X(FLOAT, cosine_learning_rate_final_fraction, "0.1", 1, "the cosine ends at this fraction of learning_rate") \
	X(INT,   learning_rate_schedule_steps, "-1", 1, "-1: steps") \
	X(FLOAT, adam_b1, "0.9", 1, "") \
	X(FLOAT, adam_b2, "0.95", 1, "") \
	X(FLOAT, adam_eps, "1e-08", 1, "") \
	X(FLOAT, adam_weight_decay, "0.1", 1, "") \
	X(FLOAT, muon_momentum, "0.95", 1, "") \
	X(STR,   muon_assign, "size", 1, "which device of a Muon group orthogonalises each matrix: size (longest first, to the least loaded) | round_robin") \
	X(FLOAT, gradient_clipping_threshold, "1", 1, "0: off") \
	X(BOOL,  shard_optimizer_over_data, "false", 1, "ZeRO-1: shard optimizer state over the data axis") \
	X(FLOAT, grad_bucket_mb, "25", 1, "MiB of gradients one bucket sums over the mesh at most (the first 1 MiB), each started during the backward as soon as it is final (ZeRO-1: reduce-scattered, its parameters gathered again bucket by bucket as the update finishes each); 0: one bucket per layout bucket, summed after the backward, ZeRO-1's gather after the whole update, FSDP's first gathers with the step") \
	/* --- data (docs/data.md) --- */ \
	X(STR,   dataset_type, "synthetic", 1, "synthetic | text (bytes) | llmc (llm.c shards) | raw (headerless tokens, nanoGPT's train.bin) | megatron (Megatron-LM .idx + .bin)") \
	X(STR,   dataset_path, "", 1, "text: a file; llmc, raw: a file, a directory (its *.bin) or a glob; megatron: a PREFIX (PREFIX.idx, PREFIX.bin), a directory (its *.idx) or a glob; shards in name order") \
	X(STR,   eval_dataset_path, "", 1, "held-out data for eval_interval and meshrun eval, as dataset_path; \"\": the eval_split_fraction of dataset_path") \
	X(STR,   eval_dataset_type, "", 1, "the format of eval_dataset_path; \"\": dataset_type") \
	X(FLOAT, eval_split_fraction, "0", 1, "without eval_dataset_path: this fraction of dataset_path's rows (its last ones) is held out for evaluation and never trained on") \
	X(INT,   dataset_token_bytes, "2", 1, "raw: bytes per token, 2 (uint16) or 4 (uint32)") \
	X(BOOL,  dataset_respect_documents, "false", 1, "no loss on a target that starts a new document (megatron: its document index; llmc, raw: the token after eot_token)") \
	X(INT,   eot_token, "-1", 1, "llmc, raw: the token that ends a document (GPT-2: 50256); -1: none") \
	X(INT,   data_shuffle_seed, "0", 1, "epoch e's row order is a permutation seeded with data_shuffle_seed + e") \
	X(INT,   eval_interval, "-1", 1, "evaluate on the held-out data after every this many steps; -1: never") \
	X(INT,   eval_steps, "-1", 1, "global batches per evaluation; -1: every held-out row") \
	/* --- logs and checkpoints --- */ \
	X(INT,   log_period, "1", 1, "step log and --metrics line every this many steps (and the last); 0: none but evaluations") \
	X(INT,   checkpoint_period, "0", 1, "with --checkpoint-dir, a checkpoint every this many steps and at the end; 0: only at the end") \
	X(STR,   checkpoint_dtype, "f32", 1, "f32 | bf16: the dtype of saved model weights") \
	X(INT,   openblas_threads, "0", 0, "0: max(1, cores / devices on this machine, every agent's counted)") \
	X(INT,   device_nice, "0", 0, "the nice value a device thread computes at (0-19, README \"Threads and cores\"): a lower priority than its host's stream, net and communication threads (nice 0), so that one woken by arriving bytes may take the core from a computing device; 0 (the default, measured best on a shared machine): no change") \
	X(BOOL,  device_batch, "false", 0, "true: device threads compute under SCHED_BATCH (never preempting a woken thread; measured against device_nice in bench/README.md)") \
	X(STR,   cpu_bind, "auto", 0, "auto | none | spread: auto: meshrun local (and bench link, bench collectives) binds each of its k agents to its own k-th of the CPUs it may use when k x devices a host <= those CPUs, as mpirun binds ranks (README \"Threads and cores\"); none: every agent may run on all of them; spread: always binds, k <= CPUs as auto, more agents than CPUs agent i on CPU i mod CPUs, so neighbours i and i+1 never share one (emulates hosts with their own cores); ssh and Slurm launches start one agent a host and never bind")

#define CFG_ICI_KEY(X, e, name, stem, def) \
	X(INT, ici_##stem##_parallelism, def, 1, "devices of a host along the " #name " axis")
#define CFG_DCN_KEY(X, e, name, stem, def) \
	X(INT, dcn_##stem##_parallelism, def, 1, "hosts along the " #name " axis")

enum cfg_type { CFG_T_INT, CFG_T_FLOAT, CFG_T_BOOL, CFG_T_STR, CFG_T_LIST };

#define CFG_CTYPE_INT   long long
#define CFG_CTYPE_FLOAT double
#define CFG_CTYPE_BOOL  bool
#define CFG_CTYPE_STR   char
#define CFG_CTYPE_LIST  struct cfg_list
#define CFG_ARR_INT
#define CFG_ARR_FLOAT
#define CFG_ARR_BOOL
#define CFG_ARR_STR     [CFG_STR]
#define CFG_ARR_LIST

#define CFG_COUNT_KEY(t, name, def, hash, help) +1
#define CFG_NKEYS (0 CFG_KEYS(CFG_COUNT_KEY))
#define CFG_MAX_FILES 32

/* Where each key's value came from: the last place that set it. The
 * loader fills it (cfg_load_file, cfg_override, cfg_override_at,
 * cfg_list_append); a key no one set is its default. file_of[i] for key
 * i of the table: 0 default, CFG_FROM_CMDLINE, CFG_FROM_FILE_UNNAMED (a
 * file past the first CFG_MAX_FILES), else 1 + an index into file[];
 * line_of[i] 0 means the file as a whole (a checkpoint's config.json). */
#define CFG_FROM_CMDLINE (-1)
#define CFG_FROM_FILE_UNNAMED (-2)
struct cfg_origins {
	int nfiles;
	char file[CFG_MAX_FILES][CFG_STR];
	int16_t file_of[CFG_NKEYS];
	uint32_t line_of[CFG_NKEYS];
};

struct cfg {
#define CFG_FIELD(t, name, def, hash, help) CFG_CTYPE_##t name CFG_ARR_##t;
	CFG_KEYS(CFG_FIELD)
#undef CFG_FIELD
	/* derived by cfg_finish() */
	int ici[AX_COUNT], dcn[AX_COUNT];
	int num_hosts, devices_per_host;
	/* not a key: for error messages only, never hashed or written */
	struct cfg_origins origin;
};

/* Fills every key with its default. */
void cfg_defaults(struct cfg *c);
/* Loads a YAML file over c (keys it names replace what c holds); a key
 * `base_config: FILE` loads FILE (relative to this file) first. 0 or -errno,
 * detail in err. */
int cfg_load_file(struct cfg *c, const char *path, char *err, size_t errlen);
/* Applies one `key=value` from the command line. 0 or -EINVAL with err
 * naming the key. */
int cfg_override(struct cfg *c, const char *kv, char *err, size_t errlen);
/* The same for a `key=value` read from file as a whole (a checkpoint's
 * config.json): the key's origin is then that file. */
int cfg_override_at(struct cfg *c, const char *kv, const char *file, char *err, size_t errlen);
/* Appends item to the LIST key (a repeated command-line flag such as
 * --fault). 0 or -EINVAL with err (not a list, full, a ',' in item). */
int cfg_list_append(struct cfg *c, const char *key, const char *item, char *err, size_t errlen);
/* Validates and derives mesh sizes; fills one -1 per family. With
 * want_hosts/want_devices > 0, checks the mesh multiplies to them (and fills
 * -1 from them). 0 or -EINVAL with err, every key it names followed by
 * where its value came from (cfg_error_origins). */
int cfg_finish(struct cfg *c, int want_hosts, int want_devices, char *err, size_t errlen);
/* Where key's value came from, as error messages say it: "'FILE' line N",
 * "'FILE'" (set from a whole file), "command line", "default" or "a
 * config file" (past CFG_MAX_FILES). 0, or -EINVAL for an unknown key. */
int cfg_key_origin(const struct cfg *c, const char *key, char *out, size_t n);
/* Adds to a range or shape error about c ("config: ...", one line, or a
 * device's "device 0: config: ...") where each key it names in quotes
 * came from, in the order it names them:
 *   config: key 'per_device_batch_size' must be >= 1, got -2
 *     (per_device_batch_size: 'configs/x.yml' line 12)
 *   config: key 'heartbeat_timeout_s' (10) must exceed 'heartbeat_interval_s'
 *     (20) > 0 (heartbeat_timeout_s: default; heartbeat_interval_s: command line)
 * (each on one line). At the end, so the message's own words stay as
 * they were. A message that names no key, is not a config error or has
 * its origins already is left alone, so it may be applied twice; the
 * loader's own errors (unknown key, wrong type, given twice) name their
 * file and line themselves. */
void cfg_error_origins(const struct cfg *c, char *err, size_t errlen);
/* A byte count like 4096, 64K, 16M, 1G (optional B): 0 or -EINVAL. */
int cfg_parse_bytes(const char *s, size_t *out);
/* The value of axis a's dcn_* (dcn) or ici_* size key, as configured
 * (-1 = fill in); cfg_finish's results are in c->dcn[] and c->ici[]. */
long long cfg_axis_key(const struct cfg *c, bool dcn, enum mesh_axis a);
/* What the configured sizes of one family (dcn or ici) multiply to, a -1
 * counting as 1: the hosts or devices per host a run needs when nothing
 * else gives them. 0 past 4096 (cfg_finish then names the problem). */
int cfg_family_product(const struct cfg *c, bool dcn);
/* Sets every ici_* and dcn_* size to 1. */
void cfg_single_device(struct cfg *c);
/* The canonical text of one key's value (as meshrun.yml writes it; a
 * list comma-separated) into out. 0, or -EINVAL for an unknown key. */
int cfg_value_text(const struct cfg *c, const char *key, char *out, size_t n);
/* SHA-256 over the canonical text of every hashed key. */
void cfg_hash(const struct cfg *c, uint8_t out[32]);
/* Writes the canonical `key: value` text of every key (a YAML file),
 * whole or not at all (host/util/out.h). 0 or -errno with err. */
int cfg_write_yaml(const struct cfg *c, const char *path, char *err, size_t errlen);

#endif
