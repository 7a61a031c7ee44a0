#!/usr/bin/env bash
# Two worker processes share four jobs, coordinated with the `baton` command line only.
#
# Each worker walks the job list (worker-b in reverse order). For each job it tries
# `baton lease acquire`: exit status 3 (CONFLICT) means the other worker has the job, so it
# moves on. With the lease held it checks `baton outcome list` (a finished job is skipped),
# does the work, renews the lease, records a fenced outcome with evidence, and releases.
# At the end every job must have been done exactly once.
#
# Run from the repository root:  bash examples/cli_two_processes.sh
# The ledger is a SQLite file in a fresh temporary directory (or BATON_LEDGER_URL); each
# run uses an org of its own.
set -euo pipefail

if ! command -v baton >/dev/null 2>&1 && [ -x .venv/bin/baton ]; then
  PATH="$PWD/.venv/bin:$PATH"
fi
WORK="$(mktemp -d "${TMPDIR:-/tmp}/baton-example-XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export BATON_LEDGER_URL="${BATON_LEDGER_URL:-sqlite:///$WORK/ledger.db}"
# An org of its own per run: with BATON_REDIS_URL set, the leases live in that Redis
# database under the org, and a second run's fresh ledger must not meet the first run's
# Redis state (one org's Redis state belongs to one ledger: docs/operations.md).
export BATON_ORG="example-$(date +%s)-$$"
JOBS="job-1 job-2 job-3 job-4"

# The value of a JSON string field in a one-line receipt: field NAME < receipt.
field() { sed -n "s/.*\"$1\": \"\([^\"]*\)\".*/\1/p"; }

worker() {
  local me="$1" jobs="$2" job key receipt lease_id status
  for job in $jobs; do
    key="$me-$job"
    status=0
    receipt="$(baton --principal "$me" --format json lease acquire job "$job" \
      --ttl-seconds 30 --execution-key "$key" --purpose "build $job")" || status=$?
    if [ "$status" -eq 3 ]; then
      echo "$me: $job is leased by someone else (CONFLICT), skipping"
      continue
    elif [ "$status" -ne 0 ]; then
      echo "$me: acquire failed with exit status $status: $receipt" >&2
      return 1
    fi
    lease_id="$(field lease_id <<<"$receipt")"

    if baton --format json outcome list "$job" | grep -q '"outcome_id"'; then
      echo "$me: $job was already done, releasing"
    else
      echo "$me: working on $job (lease $lease_id)"
      echo "$me $job" >>"$WORK/work.log"
      baton --principal "$me" --format json lease renew --lease-id "$lease_id" \
        --execution-key "$key" >/dev/null
      baton --principal "$me" --format json outcome record "$job" succeeded \
        --fence "$lease_id" --lease-id "$lease_id" \
        --evidence "kind=log,uri=file://$WORK/work.log,note=built by $me" >/dev/null
    fi
    baton --principal "$me" --format json lease release --lease-id "$lease_id" \
      --execution-key "$key" >/dev/null
  done
}

baton --format json db upgrade >/dev/null
worker worker-a "$JOBS" &
a=$!
worker worker-b "$(tr ' ' '\n' <<<"$JOBS" | tac | tr '\n' ' ')" &
b=$!
wait "$a"
wait "$b"

echo "--- summary"
failed=0
for job in $JOBS; do
  done_by="$(grep -c " $job\$" "$WORK/work.log" || true)"
  outcomes="$(baton --format json outcome list "$job" | grep -o '"outcome_id"' | wc -l)"
  echo "$job: done $done_by time(s), $outcomes outcome(s)"
  if [ "$done_by" -ne 1 ] || [ "$outcomes" -ne 1 ]; then failed=1; fi
done
if [ "$failed" -ne 0 ]; then
  echo "FAILED: a job was done twice or not at all" >&2
  exit 1
fi
echo "every job was done exactly once"
