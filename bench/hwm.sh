# Sourced by the bench scripts that start `meshrun local` under
# /usr/bin/time in the background: hwm_poll PID [SECONDS] waits for PID to
# end, polling the peak resident memory (VmHWM, /proc/PID/status) of the
# agents below it (PID's grandchildren: time -> local -> agents), and
# sets hwm0 and hwm1 to host 0's and host 1's peak in MiB.
hwm_poll() {
  local pid=$1 every=${2:-0.2} a h m
  hwm0=0 hwm1=0
  while kill -0 "$pid" 2>/dev/null; do
    for a in $(for l in $(pgrep -P "$pid" || true); do pgrep -P "$l" || true; done); do
      h=$({ tr '\0' ' ' </proc/$a/cmdline; } 2>/dev/null | sed -n 's/.*--host-id \([0-9]*\).*/\1/p')
      m=$({ awk '/VmHWM/ {print $2}' </proc/$a/status; } 2>/dev/null || true)
      [ -n "$m" ] || continue
      m=$((m / 1024))
      [ "$h" = 0 ] && [ $m -gt $hwm0 ] && hwm0=$m
      [ "$h" = 1 ] && [ $m -gt $hwm1 ] && hwm1=$m
    done
    sleep "$every"
  done
}
