"""overlap_anchor.py TRACE [STEP]: where device 0 issues each collective of
its communication track (tid 1000) in step STEP (default 1): for each
queued collective ("q ..." span), the last compute action of device 0
(F, B, I, W, embed, head, embed_back, optimizer) that had ended when it
was queued. Times are not printed, so the lines of a run with real
compute and of the same run with pipeline_compute=sleep can be diffed:
the same lines mean every hook (bucket ready, FSDP gather and release,
ZeRO-1 gathers) fires after the same action in both modes."""
import json
import sys

step = int(sys.argv[2]) if len(sys.argv) > 2 else 1
ev = [x for x in json.load(open(sys.argv[1]))['traceEvents']
      if x.get('ph') == 'X' and x['pid'] == 0 and x['args'].get('step') == step]
comp = sorted((x for x in ev if x['tid'] == 0 and x['name'].split()[0] in
               ('F', 'B', 'I', 'W', 'embed', 'head', 'embed_back', 'optimizer')), key=lambda x: x['ts'])
for q in sorted((x for x in ev if x['tid'] == 1000 and x['name'].startswith('q ')), key=lambda x: x['ts']):
    done = [c['name'] for c in comp if c['ts'] + c['dur'] <= q['ts'] + 5]
    print('%-30s after %s' % (q['name'], done[-1] if done else 'the step start'))
