#!/bin/sh
# resize.sh: an example jobcar *command* handler in POSIX sh (it pretends to resize an image).
#
# Protocol (README "Handlers"):
#   stdin                 the job's payload bytes, here one line of JSON: {"image": "cat.png", "width": 320}
#   JOBCAR_JOB_ID         the job id: the key for idempotency (a job may be delivered more than once)
#   JOBCAR_ATTEMPT        1-based attempt number (JOBCAR_MAX_ATTEMPTS, JOBCAR_JOB_TYPE, JOBCAR_QUEUE,
#                         JOBCAR_DEADLINE, JOBCAR_ENQUEUED_AT, TRACEPARENT are set too)
#   exit 0                success: stdout becomes the job's result (kept for `result_ttl`)
#   exit 65 (EX_DATAERR)  permanent failure: the job goes to the dead-letter queue after this one
#                         attempt, because the handler config lists it: `permanent_exit_codes: [65]`
#   exit 75 (EX_TEMPFAIL) temporary failure: retried with backoff (any exit code not listed is)
#   stderr                its tail becomes the job's error text when the attempt fails
#
# Only an allow-list of the daemon's environment reaches a command handler, so the state directory is
# passed through the handler's `env` in the config:
#
#   handlers:
#     image.resize:
#       command: [sh, handlers/sh/resize.sh]
#       permanent_exit_codes: [65]
#       env: {HANDLER_STATE_DIR: /var/lib/resize}
#
# Test hook: {"fail_attempts": N} in the payload fails attempts 1..N with exit 75.
set -eu

: "${JOBCAR_JOB_ID:?not run by jobcar: JOBCAR_JOB_ID is unset}"
attempt=${JOBCAR_ATTEMPT:-1}
state_dir=${HANDLER_STATE_DIR:?HANDLER_STATE_DIR is unset (set it in the handler config env)}
if ! mkdir -p "$state_dir" 2>/dev/null; then
    echo "resize.sh: cannot create state directory $state_dir" >&2
    exit 75 # maybe a volume not mounted yet: worth retrying
fi

# Idempotency: one marker file per completed job id, holding the result. Ids are arbitrary printable
# text (they may contain "/"), so any id outside a filename-safe alphabet is hex-encoded.
case $JOBCAR_JOB_ID in
    *[!A-Za-z0-9_-]*) key=x$(printf '%s' "$JOBCAR_JOB_ID" | od -An -tx1 | tr -d ' \n') ;;
    *) key=$JOBCAR_JOB_ID ;;
esac
if [ "${#key}" -gt 240 ]; then
    echo "resize.sh: job id too long for a marker file name" >&2
    exit 65
fi
marker=$state_dir/$key.done
if [ -f "$marker" ]; then
    # A redelivery of a job that already completed (e.g. the daemon lost the lease just after we
    # finished): answer success again with the same result, without redoing the work.
    echo "resize.sh: job $JOBCAR_JOB_ID already done, attempt $attempt is a redelivery" >&2
    cat "$marker"
    exit 0
fi

payload=$(cat)
# A real handler would use jq; sed is enough for one flat JSON object on one line.
field() { printf '%s\n' "$payload" | sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*$2.*/\\1/p" | head -n 1; }
image=$(field image '"\([A-Za-z0-9._-]*\)"')
width=$(field width '\([0-9][0-9]*\)')
fail_attempts=$(field fail_attempts '\([0-9][0-9]*\)')

if [ -z "$image" ] || [ -z "$width" ] || [ "${#width}" -gt 5 ] || [ "$width" -lt 1 ] || [ "$width" -gt 10000 ]; then
    # Retrying would not help: the payload itself is wrong.
    echo "resize.sh: cannot process payload: need {\"image\": \"<name>\", \"width\": 1..10000}" >&2
    exit 65
fi
if [ "$attempt" -le "${fail_attempts:-0}" ]; then
    echo "resize.sh: image store unavailable (attempt $attempt of ${JOBCAR_MAX_ATTEMPTS:-?}), try again" >&2
    exit 75
fi

# The work itself; work.log stands in for the side effect that must not happen twice.
case $image in
    *.*) output=${image%.*}.${width}w.${image##*.} ;;
    *) output=$image.${width}w ;;
esac
printf '%s %s\n' "$JOBCAR_JOB_ID" "$attempt" >>"$state_dir/work.log"
result=$(printf '{"image":"%s","width":%s,"output":"%s","attempt":%s}' "$image" "$width" "$output" "$attempt")

# Record completion atomically (write, then rename) before answering, then print the result.
printf '%s\n' "$result" >"$marker.tmp.$$"
mv "$marker.tmp.$$" "$marker"
printf '%s\n' "$result"
