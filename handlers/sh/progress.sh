#!/bin/sh
# progress.sh: a long job that says how far it got (docs/handler-api.md), in POSIX sh with curl.
#
# jobcar gives every attempt of a command handler the address of its handler API and a token for it:
#   JOBCAR_ATTEMPT_URL    http://127.0.0.1:9321/v1/attempts/<job id>
#   JOBCAR_ATTEMPT_TOKEN  a secret good for this one attempt, while it runs: sent as a Bearer token
# Payload: {"items": 5, "seconds_per_item": 1} (both optional). Each item is "processed" (a sleep), then
# logged as a line of the job's log and reported as the job's progress:
#   jobcar jobs show <id>     shows the latest progress, the dashboard's job page the log
#
#   handlers:
#     report.build:
#       command: [sh, handlers/sh/progress.sh]
set -eu

: "${JOBCAR_ATTEMPT_URL:?not run by jobcar: JOBCAR_ATTEMPT_URL is unset}"

# api METHOD PATH [curl options]: one call to this attempt's handler API; its answer is in $answer. A
# refusal (409: the job was canceled, or this attempt lost its lease and another may be running the job)
# stops the script: this attempt's answer would not count anyway.
api() {
    method=$1 path=$2
    shift 2
    if ! answer=$(curl -sS --fail-with-body -X "$method" -H "Authorization: Bearer $JOBCAR_ATTEMPT_TOKEN" \
        "$@" "$JOBCAR_ATTEMPT_URL$path"); then
        echo "progress.sh: $method $path: $answer" >&2 # e.g. {"error": "the job was canceled"}
        exit 1
    fi
}

payload=$(cat)
# A real handler would use jq; sed is enough for one flat JSON object.
field() { printf '%s\n' "$payload" | sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\([0-9.][0-9.]*\).*/\\1/p" | head -n 1; }
items=$(field items)
items=${items:-5}
pause=$(field seconds_per_item)
pause=${pause:-1}

i=0
while [ "$i" -lt "$items" ]; do
    i=$((i + 1))
    sleep "$pause" # the work on one item

    # A log line: a text/plain body is one line per line (or JSON: {"line": "..."} / {"lines": [...]}).
    printf 'item %s of %s done\n' "$i" "$items" | api POST /log -H 'Content-Type: text/plain' --data-binary @-
    # The job's progress: a percentage, a short message, or both; the latest one is kept with the job.
    api POST /progress -H 'Content-Type: application/json' \
        -d "{\"percent\": $((i * 100 / items)), \"message\": \"$i of $items items\"}"
done

# The answer is as without the API: exit 0 and stdout is the result.
printf '{"items": %s}\n' "$items"
