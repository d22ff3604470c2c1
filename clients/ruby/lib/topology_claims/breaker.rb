# frozen_string_literal: true

module TopologyClaims
  # The client-side circuit breaker (GitLab's Cells ADR 021 caps the calls in flight that hold a
  # database connection and the claims per second). Three limits, each refusing a call at once
  # with CircuitOpen naming it, counted in TopologyClaims.metrics and announced as the
  # `circuit_open.topology_claims` notification:
  # - max_in_flight: calls of this process in flight at once (0: unlimited);
  # - max_claims_per_second: claims sent per second, a token bucket with one second of burst
  #   (0: unlimited);
  # - breaker_failures consecutive calls that ended Unavailable (after their retries) open the
  #   breaker for breaker_cooldown seconds (0: never); then calls go through again, and the
  #   next one that ends Unavailable opens it again at once.
  class Breaker
    def initialize(config)
      @config = config
      @mutex = Mutex.new
      @in_flight = 0
      @failures = 0
      @open_until = nil
      @tokens = config.max_claims_per_second.to_f
      @refilled_at = now
    end

    # Runs the block when every limit admits a call of `claims` claims.
    def admit(claims)
      @mutex.synchronize { check!(claims) }
      begin
        yield
      ensure
        @mutex.synchronize { @in_flight -= 1 }
      end
    end

    def success
      @mutex.synchronize do
        @failures = 0
        @open_until = nil
      end
    end

    def failure
      @mutex.synchronize do
        @failures += 1
        limit = @config.breaker_failures
        @open_until = now + @config.breaker_cooldown if limit.positive? && @failures >= limit
      end
    end

    private

    def check!(claims)
      if @open_until && now < @open_until
        trip!(:breaker, "the circuit breaker is open after #{@failures} consecutive unavailable calls " \
                        "(breaker_failures); calls resume in #{(@open_until - now).round(2)}s (breaker_cooldown)")
      end
      @open_until = nil if @open_until
      max = @config.max_in_flight
      if max.positive? && @in_flight >= max
        trip!(:max_in_flight, "#{@in_flight} calls are in flight, the limit (max_in_flight)")
      end
      rate = @config.max_claims_per_second
      if rate.positive?
        elapsed = now - @refilled_at
        @tokens = [rate.to_f, @tokens + (elapsed * rate)].min
        @refilled_at = now
        if @tokens < claims && claims <= rate
          trip!(:max_claims_per_second, "#{claims} claims would exceed max_claims_per_second=#{rate}")
        end
        @tokens -= claims
      end
      @in_flight += 1
    end

    def trip!(limit, message)
      TopologyClaims.metrics.increment(:circuit_open, limit)
      TopologyClaims.instrument("circuit_open", limit: limit)
      raise CircuitOpen.new("claims call not sent: #{message}", limit: limit)
    end

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end
end
