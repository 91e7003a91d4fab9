#!/bin/sh
# steps.sh: a job in steps that does not redo a finished step when it is retried (docs/handler-api.md,
# "Durable steps"), in POSIX sh with curl.
#
# Each step's result is kept with the job (PUT $JOBCAR_ATTEMPT_URL/steps/<name>). When an attempt dies
# half-way (kill -9, a crash, a lost node, a timeout), the next attempt of the same job reads the
# finished steps back (GET .../steps/<name>: 200 and the result, or 404) and goes on from there.
#
# The job: reserve a seat, then charge for it. Both are side effects that must not happen twice; here
# they are lines appended to $HANDLER_STATE_DIR/effects.log. Payload: {"order": "A-17"}.
# Test hook: {"die_after_first_step": true} kills this script with SIGKILL (kill -9) on its first
# attempt, right after the first step was kept; jobcar retries it, and the retry skips that step.
#
#   handlers:
#     order.place:
#       command: [sh, handlers/sh/steps.sh]
#       env: {HANDLER_STATE_DIR: /var/lib/orders}
#
# At least once, still: a step killed after its side effect but before its PUT runs again. Make each step
# idempotent on its own where that matters (an idempotency key of "<job id>/<step>" to the payment API).
set -eu

: "${JOBCAR_ATTEMPT_URL:?not run by jobcar: JOBCAR_ATTEMPT_URL is unset}"
state_dir=${HANDLER_STATE_DIR:?HANDLER_STATE_DIR is unset (set it in the handler config env)}
mkdir -p "$state_dir"
auth="Authorization: Bearer $JOBCAR_ATTEMPT_TOKEN"
payload=$(cat)
order=$(printf '%s\n' "$payload" | sed -n 's/.*"order"[[:space:]]*:[[:space:]]*"\([A-Za-z0-9._-]*\)".*/\1/p')
order=${order:-unnamed}

# log LINE: a line of the job's log (a text/plain body is one line per line).
log() {
    if ! answer=$(printf '%s\n' "$1" | curl -sS --fail-with-body -H "$auth" -H 'Content-Type: text/plain' \
        --data-binary @- "$JOBCAR_ATTEMPT_URL/log"); then
        echo "steps.sh: log: $answer" >&2
        exit 1
    fi
}

# step NAME FUNCTION: the step's result in $result: read back if an earlier attempt kept it, else made by
# FUNCTION (which prints it) and kept.
step() {
    name=$1 work=$2
    # -w appends the status on a line of its own after the body.
    answer=$(curl -sS -w '\n%{http_code}' -H "$auth" "$JOBCAR_ATTEMPT_URL/steps/$name")
    status=$(printf '%s\n' "$answer" | tail -n 1)
    case $status in
        200)
            result=$(printf '%s\n' "$answer" | sed '$d')
            log "step $name: kept by an earlier attempt, skipped"
            return
            ;;
        404) ;; # not done yet
        *)
            echo "steps.sh: GET step $name: HTTP $answer" >&2
            exit 1
            ;;
    esac
    result=$($work)
    # Kept only while this attempt holds the job: a refused PUT (409) means another attempt may run it.
    if ! answer=$(curl -sS --fail-with-body -X PUT -H "$auth" -H 'Content-Type: application/octet-stream' \
        --data-binary "$result" "$JOBCAR_ATTEMPT_URL/steps/$name"); then
        echo "steps.sh: PUT step $name: $answer" >&2
        exit 1
    fi
    log "step $name: done"
}

reserve() {
    printf 'reserve %s %s\n' "$order" "$JOBCAR_ATTEMPT" >>"$state_dir/effects.log"
    printf 'seat-%s-%s' "$order" "$JOBCAR_ATTEMPT" # which attempt reserved it
}

charge() {
    printf 'charge %s %s\n' "$order" "$seat" >>"$state_dir/effects.log"
    printf 'paid-%s' "$seat"
}

step reserve reserve
seat=$result
if [ "$JOBCAR_ATTEMPT" = 1 ] && printf '%s' "$payload" | grep -q '"die_after_first_step"[[:space:]]*:[[:space:]]*true'; then
    kill -9 $$ # the test hook: a crash between the steps
fi
step charge charge
receipt=$result

printf '{"order": "%s", "seat": "%s", "receipt": "%s", "attempt": %s}\n' "$order" "$seat" "$receipt" "$JOBCAR_ATTEMPT"
