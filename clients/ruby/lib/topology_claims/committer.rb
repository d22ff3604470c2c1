# frozen_string_literal: true

module TopologyClaims
  # Sends CommitUpdate after a save's local COMMIT from a background thread, so the save returns
  # without waiting for it (configuration `commit_in_background`, default true; decision 115).
  #
  # Safe for the same reason a lost CommitUpdate always was: the lease's leases_outstanding row
  # is deleted only after its CommitUpdate succeeded, so a process that dies with commits queued
  # leaves rows the reconciler commits. Meanwhile the claims are routable (CREATING) and no other
  # cell can take them. Before a later save of this process touches a claim whose commit is still
  # queued, it waits for that commit (at most the call timeout), so create-then-rename in one
  # request never meets its own lease. A full queue (`max_background_commits`, default 1,000)
  # commits inline. At a clean exit the queue is drained (at most DRAIN_AT_EXIT seconds).
  class Committer
    DRAIN_AT_EXIT = 5.0

    Job = Struct.new(:client, :lease_id, :keys, :connection, keyword_init: true)

    def self.instance
      @mutex ||= Mutex.new
      @mutex.synchronize do
        # A forked child has the parent's object but not its thread: a fresh one per process.
        @instance = nil if @instance && @instance.pid != Process.pid
        @instance ||= new
      end
    end

    attr_reader :pid

    def initialize
      @pid = Process.pid
      @mutex = Mutex.new
      @changed = ConditionVariable.new
      @queue = []
      @pending = Hash.new(0) # claim key => queued or in-flight commits holding it
      @thread = nil
    end

    # Commits `lease_id` (claims `keys`, [namespace, value] pairs) now or soon.
    def commit(client, lease_id, keys:, connection:)
      job = Job.new(client: client, lease_id: lease_id, keys: keys, connection: connection)
      inline = @mutex.synchronize do
        next true if @queue.size >= client.config.max_background_commits

        @queue << job
        keys.each { |k| @pending[k] += 1 }
        start_thread
        @changed.broadcast
        false
      end
      Committer.send_commit(job) if inline
    end

    # Waits until no queued commit holds any of `keys` (at most `timeout` seconds); true when
    # none does.
    def wait_for(keys, timeout)
      wait_until(timeout) { keys.none? { |k| @pending.key?(k) } }
    end

    # Waits until the queue is empty (at most `timeout` seconds): tests, a clean exit.
    def drain(timeout = DRAIN_AT_EXIT)
      wait_until(timeout) { @queue.empty? && @pending.empty? }
    end

    def queued = @mutex.synchronize { @queue.size }

    # CommitUpdate, then the row to delete with the next transaction; a failure is logged and
    # counted, the row left to the reconciler.
    def self.send_commit(job)
      job.client.commit_update(job.lease_id)
    rescue LeaseRolledBack => e
      TopologyClaims.metrics.increment(:lost_claims)
      TopologyClaims.logger.error("topology_claims: lease #{job.lease_id} was rolled back after the local COMMIT; " \
                                  "its claims are lost until the verifier repairs them: #{e.message}")
    rescue Error => e
      TopologyClaims.metrics.increment(:commit_failures)
      TopologyClaims.logger.warn("topology_claims: #{e.message}; the reconciler will commit lease #{job.lease_id}")
    else
      # Its leases_outstanding row goes with this database's next claims transaction.
      Committed.add(job.connection, job.lease_id)
    end

    private

    # Waits (at most `timeout` seconds) until the block, run under the lock, is true.
    def wait_until(timeout)
      deadline = monotonic + timeout
      @mutex.synchronize do
        until yield
          left = deadline - monotonic
          return false if left <= 0

          @changed.wait(@mutex, left)
        end
      end
      true
    end

    def start_thread
      return if @thread&.alive?

      @thread = Thread.new { run }
      @thread.name = "topology_claims committer" if @thread.respond_to?(:name=)
    end

    def run
      loop do
        job = @mutex.synchronize do
          @changed.wait(@mutex, 1.0) while @queue.empty?
          @queue.first
        end
        begin
          Committer.send_commit(job)
        rescue StandardError => e # never let the thread die with jobs queued
          TopologyClaims.logger.error("topology_claims: committer: #{e.class}: #{e.message}")
        ensure
          @mutex.synchronize do
            @queue.shift
            job.keys.each { |k| (@pending[k] -= 1).zero? && @pending.delete(k) }
            @changed.broadcast
          end
        end
      end
    end

    def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  at_exit { Committer.instance.drain if Committer.instance_variable_get(:@instance) }
end
