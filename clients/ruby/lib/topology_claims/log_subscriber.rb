# frozen_string_literal: true

require "active_support/log_subscriber"

module TopologyClaims
  # Logs the gem's notifications (`NAME.topology_claims`) to Rails' log: each call at debug
  # level with its method, outcome and time, the lease of a save at debug level, and an open
  # circuit at warn level. Attached by the Railtie; elsewhere:
  # `TopologyClaims::LogSubscriber.attach_to :topology_claims`.
  class LogSubscriber < ActiveSupport::LogSubscriber
    def call(event)
      payload = event.payload
      debug do
        detail = payload[:reason] ? " #{payload[:reason]}" : ""
        retries = payload[:attempts].to_i > 1 ? ", #{payload[:attempts]} attempts" : ""
        # The call's own time (seconds, every attempt), measured by the client: the event is
        # instrumented once the call has ended, so event.duration would be ~0.
        "  TopologyClaims #{payload[:method]} #{payload[:code]}#{detail} " \
          "(#{format('%.1f', payload[:duration].to_f * 1000)}ms#{retries})"
      end
    end

    def lease_begun(event)
      payload = event.payload
      debug { "  TopologyClaims lease #{payload[:lease_id]} begun for #{payload[:claims]} claim(s)" }
    end

    def local_committed(event)
      debug { "  TopologyClaims lease #{event.payload[:lease_id]} committed locally" }
    end

    def circuit_open(event)
      warn { "  TopologyClaims call not sent: #{event.payload[:limit]} limit reached (circuit open)" }
    end
  end
end

TopologyClaims::LogSubscriber.attach_to :topology_claims
