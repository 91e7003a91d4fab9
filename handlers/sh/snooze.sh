#!/bin/sh
# snooze.sh: a job that comes back later, without spending an attempt, while what it needs is not there
# yet (docs/handler-api.md, "Snooze"), in POSIX sh.
#
# The job publishes a file someone else exports: payload {"file": "/srv/exports/today.csv", "delay": "30s"}.
# While the file is missing, the job snoozes for `delay`. A snooze is not a failure: the job's attempt
# count stays, up to the handler's `max_snoozes` (20 unless set; 429/503 answers count too). Past it,
# a snooze spends an attempt like any retry.
#
# A command snoozes in one of two ways:
#   - exit 75 with the delay on stdout (`30s`, `2m`, or seconds): no API call needed;
#   - POST $JOBCAR_ATTEMPT_URL/snooze {"delay": "30s"}: 202, the attempt is over. Whatever the command
#     prints or exits with afterwards is not used, and its later calls are refused (409).
# This script takes the first way, or the second with {"via": "api"} in the payload.
#
#   handlers:
#     export.publish:
#       command: [sh, handlers/sh/snooze.sh]
#       max_snoozes: 100
set -eu

payload=$(cat)
field() { printf '%s\n' "$payload" | sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\"\([^\"]*\)\".*/\\1/p" | head -n 1; }
file=$(field file)
delay=$(field delay)
delay=${delay:-30s}

if [ ! -e "$file" ]; then
    echo "snooze.sh: $file is not there yet, back in $delay" >&2
    if [ "$(field via)" = api ]; then
        curl -sS --fail-with-body -o /dev/null -X POST -H "Authorization: Bearer $JOBCAR_ATTEMPT_TOKEN" \
            -H 'Content-Type: application/json' -d "{\"delay\": \"$delay\"}" "$JOBCAR_ATTEMPT_URL/snooze"
        exit 0 # not used: the snooze answered the attempt
    fi
    printf '%s\n' "$delay"
    exit 75 # EX_TEMPFAIL with a delay on stdout: a snooze
fi

# The work, once the file is there.
lines=$(wc -l <"$file" | tr -d ' ')
printf '{"file": "%s", "lines": %s, "attempt": %s}\n' "$file" "$lines" "$JOBCAR_ATTEMPT"
