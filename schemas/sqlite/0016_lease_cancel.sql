-- A request that the run's holder end it cancelled at its next boundary (onward cancel of a run
-- a worker drives): who asked and why. It belongs to one holding: every acquisition and every
-- release clears it, and renewals hand it to the holder.
ALTER TABLE onward_leases ADD COLUMN cancel_by TEXT;
ALTER TABLE onward_leases ADD COLUMN cancel_why TEXT;
