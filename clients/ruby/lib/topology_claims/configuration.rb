# frozen_string_literal: true

module TopologyClaims
  # Every knob of the gem, with its default and its environment variable. The variables shared
  # with the Rust sidecars (`topology-claims reconcile` / `verify`) have the same names there:
  # TOPOLOGY_CLAIMS_SERVER, _CELL_ID, _TLS_CA, _TLS_CERT, _TLS_KEY, _TLS_SERVER_NAME,
  # _CALL_TIMEOUT and _STALENESS. Durations are seconds (Float) in Ruby; in the environment, a
  # whole number and a unit as for the sidecars (`500ms`, `5s`, `10m`) or plain seconds.
  #
  # Reading a Configuration never connects anywhere: channels are made at the first call, in the
  # process that makes it (see Client).
  class Configuration
    # name => [env var, default, kind]
    KNOBS = {
      address: ["TOPOLOGY_CLAIMS_SERVER", "http://127.0.0.1:50051", :string],
      cell_id: ["TOPOLOGY_CLAIMS_CELL_ID", nil, :string],
      timeout: ["TOPOLOGY_CLAIMS_CALL_TIMEOUT", 5.0, :duration],
      in_transaction_deadline: ["TOPOLOGY_CLAIMS_IN_TRANSACTION_DEADLINE", 0.2, :duration],
      max_attempts: ["TOPOLOGY_CLAIMS_MAX_ATTEMPTS", 5, :integer],
      staleness: ["TOPOLOGY_CLAIMS_STALENESS", 600.0, :duration],
      safety_margin: ["TOPOLOGY_CLAIMS_SAFETY_MARGIN", 60.0, :duration],
      max_in_flight: ["TOPOLOGY_CLAIMS_MAX_IN_FLIGHT", 16, :integer],
      max_claims_per_second: ["TOPOLOGY_CLAIMS_MAX_CLAIMS_PER_SECOND", 0, :integer],
      breaker_failures: ["TOPOLOGY_CLAIMS_BREAKER_FAILURES", 5, :integer],
      breaker_cooldown: ["TOPOLOGY_CLAIMS_BREAKER_COOLDOWN", 5.0, :duration],
      enabled: ["TOPOLOGY_CLAIMS_ENABLED", true, :boolean],
      commit_in_background: ["TOPOLOGY_CLAIMS_COMMIT_IN_BACKGROUND", true, :boolean],
      max_background_commits: ["TOPOLOGY_CLAIMS_MAX_BACKGROUND_COMMITS", 1000, :integer],
      row_at_begin: ["TOPOLOGY_CLAIMS_ROW_AT_BEGIN", true, :boolean]
    }.freeze
    TLS_ENV = {
      ca: "TOPOLOGY_CLAIMS_CLIENT_TLS_CA", cert: "TOPOLOGY_CLAIMS_CLIENT_TLS_CERT",
      key: "TOPOLOGY_CLAIMS_CLIENT_TLS_KEY", server_name: "TOPOLOGY_CLAIMS_CLIENT_TLS_SERVER_NAME"
    }.freeze

    attr_accessor(*KNOBS.keys)
    # `{ ca:, cert:, key:, server_name: }`, file paths (PEM); nil for plaintext (http://).
    attr_accessor :tls
    # Where failures that are logged, never raised (CommitUpdate after COMMIT…), go.
    attr_accessor :logger

    def initialize(env = ENV)
      KNOBS.each { |name, (_var, default, _kind)| public_send("#{name}=", default) }
      @tls = nil
      @logger = nil
      apply_env(env)
    end

    # The settings `env` sets (TOPOLOGY_CLAIMS_*), over what this configuration holds.
    def apply_env(env)
      KNOBS.each do |name, (var, _default, kind)|
        public_send("#{name}=", self.class.parse(var, env[var], kind)) if env.key?(var)
      end
      tls = TLS_ENV.each_with_object({}) { |(k, var), h| h[k] = env[var] if env[var] && !env[var].empty? }
      @tls = (@tls || {}).merge(tls) unless tls.empty?
      self
    end

    # Settings from a hash (Rails' config.x.topology_claims, credentials): knob names as keys
    # (cell_id:, address:, timeout: 5 or "5s", tls: { ca:, cert:, key:, server_name: }).
    # `source` names the hash in errors; an unknown key is refused, naming it.
    def apply(settings, source:)
      (settings || {}).to_h.each do |key, value|
        name = key.to_sym
        if name == :tls
          unknown = value.to_h.keys.map(&:to_sym) - TLS_ENV.keys
          raise ConfigurationError, "#{source}.tls: unknown key(s) #{unknown.join(', ')} (#{TLS_ENV.keys.join(', ')})" if unknown.any?

          @tls = (@tls || {}).merge(value.to_h.transform_keys(&:to_sym).transform_values(&:to_s))
          next
        end
        _var, _default, kind = KNOBS.fetch(name) do
          raise ConfigurationError, "#{source}.#{key}: unknown setting (#{(KNOBS.keys + [:tls]).join(', ')})"
        end
        value = self.class.parse("#{source}.#{key}", value, kind) if value.is_a?(String) && kind != :string
        public_send("#{name}=", value)
      end
      self
    end

    def self.parse(var, text, kind)
      case kind
      when :string then text
      when :integer
        Integer(text, 10)
      when :boolean
        case text.downcase
        when "true", "1", "yes", "on" then true
        when "false", "0", "no", "off" then false
        else raise ConfigurationError, "#{var}=#{text.inspect} is not true/false"
        end
      when :duration then parse_duration(var, text)
      end
    rescue ArgumentError
      raise ConfigurationError, "#{var}=#{text.inspect} is not a valid #{kind}"
    end

    UNITS = { "ms" => 0.001, "s" => 1, "m" => 60, "h" => 3600, "d" => 86_400 }.freeze

    def self.parse_duration(var, text)
      match = /\A(\d+(?:\.\d+)?)(ms|s|m|h|d)?\z/.match(text.strip)
      raise ConfigurationError, "#{var}=#{text.inspect} is not a duration (e.g. 500ms, 5s, 10m)" unless match

      Float(match[1]) * UNITS.fetch(match[2] || "s")
    end

    # Checked at the first call (not at boot): names the missing or wrong setting.
    def validate!
      raise ConfigurationError, "cell_id is not set (TopologyClaims.configure { |c| c.cell_id = ... } or TOPOLOGY_CLAIMS_CELL_ID)" if cell_id.nil? || cell_id.empty?
      raise ConfigurationError, "address #{address.inspect} is https:// but tls is not set (tls = { ca:, cert:, key: })" if address.start_with?("https://") && tls.nil?
      raise ConfigurationError, "address #{address.inspect} is http:// but tls is set: use https://" if address.start_with?("http://") && tls
      raise ConfigurationError, "in_transaction_deadline must be positive" unless in_transaction_deadline.positive?

      self
    end

    # host:port, without the scheme.
    def target
      address.sub(%r{\Ahttps?://}, "").chomp("/")
    end

    # How long after BeginUpdate was sent the local COMMIT is still allowed.
    def commit_window
      staleness - safety_margin
    end

    def dup_with(**changes)
      copy = dup
      changes.each { |k, v| copy.public_send("#{k}=", v) }
      copy
    end
  end
end
