# frozen_string_literal: true

module TopologyClaims
  # Process-local counters (thread-safe): `calls` by "Method CODE", `circuit_open` by limit,
  # `commit_failures` / `rollback_failures` (phase-3 calls that failed after the local
  # transaction ended: logged, never raised; the reconciler heals them), `lost_claims`
  # (LEASE_ROLLED_BACK after the local COMMIT: the verifier repairs them). Read with `snapshot`;
  # export them to your metrics system from there, or subscribe to the notifications.
  class Metrics
    def initialize
      @mutex = Mutex.new
      @counters = Hash.new { |h, k| h[k] = Hash.new(0) }
    end

    def increment(name, label = nil, by = 1)
      @mutex.synchronize { @counters[name][label] += by }
    end

    def get(name, label = nil)
      @mutex.synchronize { @counters.key?(name) ? @counters[name][label] : 0 }
    end

    def snapshot
      @mutex.synchronize { @counters.transform_values(&:dup) }
    end

    def reset!
      @mutex.synchronize { @counters.clear }
    end
  end
end
