# frozen_string_literal: true

require "open3"
require "timeout"

module TopologyClaims
  # Test helpers: the real `topology-claims serve` as a child process (require
  # "topology_claims/testing"). For tests that need no server, TopologyClaims.disable!.
  module Testing
    BIN_ENV = "TOPOLOGY_CLAIMS_BIN"

    # The binary: $TOPOLOGY_CLAIMS_BIN, else `topology-claims` on the PATH.
    def self.binary
      path = ENV[BIN_ENV] || "topology-claims"
      return path if path.include?("/") ? File.executable?(path) : system("command -v #{path} >/dev/null 2>&1")

      raise Error, "#{path} is not an executable topology-claims binary: put topology-claims on the PATH, or set " \
                   "#{BIN_ENV} to the binary (cargo build --release puts it in target/release)" unless ENV[BIN_ENV]

      raise Error, "#{BIN_ENV}=#{path} is not an executable topology-claims binary (build it with cargo build)"
    end

    # The environment without the caller's TOPOLOGY_CLAIMS_* settings (each knob has an env
    # var, so a developer's shell must not change what a test runs).
    def self.clean_env
      ENV.keys.grep(/\ATOPOLOGY_CLAIMS_/).to_h { |k| [k, nil] }
    end

    # Runs `topology-claims ARGS` to completion: [stdout, stderr, Process::Status].
    def self.run(*args, binary: self.binary, timeout: 60)
      Timeout.timeout(timeout) { Open3.capture3(clean_env, binary, *args.map(&:to_s)) }
    end

    # A running `topology-claims serve` (memory store, a free loopback port by default).
    class Server
      attr_reader :address, :pid

      # `args`: further serve flags (e.g. the --tls-* ones).
      def self.start(*args, binary: Testing.binary, store: "memory:")
        new(binary, ["serve", "--listen", "127.0.0.1:0", "--store", store, *args])
      end

      def initialize(binary, argv)
        @stdout_r, stdout_w = IO.pipe
        @log = Tempfile.create("topology-claims-serve")
        @pid = Process.spawn(Testing.clean_env.merge("RUST_LOG" => ENV.fetch("RUST_LOG", "warn")),
                             binary, *argv, out: stdout_w, err: @log, in: File::NULL)
        stdout_w.close
        line = Timeout.timeout(60) { @stdout_r.gets }
        match = /\Alistening on (\S+)/.match(line.to_s)
        unless match
          stop
          raise Error, "topology-claims serve did not announce `listening on HOST:PORT` (printed #{line.inspect}): #{File.read(@log.path)}"
        end
        @address = match[1]
      end

      # http://HOST:PORT, for the sidecars' --server.
      def url(scheme = "http") = "#{scheme}://#{address}"

      def port = address.split(":").last.to_i

      # SIGTERM, then waits (SIGKILL after `patience` seconds).
      def stop(patience: 10)
        return unless @pid

        Process.kill(:TERM, @pid)
        begin
          Timeout.timeout(patience) { Process.wait(@pid) }
        rescue Timeout::Error
          Process.kill(:KILL, @pid)
          Process.wait(@pid)
        end
      rescue Errno::ESRCH, Errno::ECHILD
        nil
      ensure
        @pid = nil
        @stdout_r&.close unless @stdout_r&.closed?
      end
    end
  end
end

require "tempfile"
