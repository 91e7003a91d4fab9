#!/bin/sh
# A command handler: the payload arrives on stdin and the job's metadata in JOBCAR_* variables.
# Exit 0 = success (stdout becomes the job's result); another exit code = retry, or the DLQ when listed
# in the handler's permanent_exit_codes. stderr's tail becomes the job's error text when it fails.
set -eu

payload=$(cat)
echo "hello.sh: job ${JOBCAR_JOB_ID} (${JOBCAR_JOB_TYPE:-?}), attempt ${JOBCAR_ATTEMPT} of ${JOBCAR_MAX_ATTEMPTS:-?}" >&2
printf 'hello from job %s, attempt %s: %s\n' "${JOBCAR_JOB_ID}" "${JOBCAR_ATTEMPT}" "${payload}"
exit 0
