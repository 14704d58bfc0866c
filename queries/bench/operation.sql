-- name: OperationReserve :execrows
-- The baseline's reservation of (scope, key), with the run's lease. Zero rows
-- means the key was taken.
INSERT INTO bench_operation (id, scope, key, input, locked_by, locked_until)
VALUES (@id, @scope, @key, @input, @run_id, now() + @lease::interval)
ON CONFLICT (scope, key) DO NOTHING;

-- name: OperationFinish :execrows
-- Stores the baseline's answer, fenced by the run's lease, once its refund is
-- marked succeeded in the same transaction.
UPDATE bench_operation
SET state = 'succeeded',
    result = @result,
    locked_by = NULL,
    finished_at = now()
WHERE bench_operation.id = @id
  AND bench_operation.locked_by = @run_id
  AND bench_operation.state = 'in_progress'
  AND EXISTS (SELECT 1 FROM demo_refund AS r WHERE r.id = sqlc.arg(refund_id)::text AND r.status = 'succeeded');
