# frozen_string_literal: true

require "active_record"
require "active_support/concern"
require "topology_claims/active_record_compat"
require "topology_claims/begin_with_row"
require "securerandom"

module TopologyClaims
  ActiveRecordCompat.check!
  (warning = ActiveRecordCompat.warning) && TopologyClaims.logger.warn(warning)

  ::I18n.load_path << File.expand_path("locale/en.yml", __dir__) if defined?(::I18n)

  # Raised (as ActiveRecord::RecordInvalid) when the service refused a claim of `record`; the
  # refusal is in record.errors (`:taken` for CLAIM_TAKEN, `:claim_leased` for CLAIM_LEASED,
  # `:restore_quarantine` for RESTORE_QUARANTINE).
  # `cause_error` is the TopologyClaims::ClaimError.
  class ClaimsInvalid < ::ActiveRecord::RecordInvalid
    attr_reader :claims_error

    def initialize(record, claims_error)
      @claims_error = claims_error
      super(record)
    end
  end

  # Declarative claims for an ActiveRecord model:
  #
  #   class User < ApplicationRecord
  #     include TopologyClaims::Claimable
  #     claims_owner :user                  # owner type; owner_value is the record id (value: :attr)
  #     claims_table :users                 # source table; table_record_id is the record id
  #     claim :username, type: :username
  #     claim :email, type: :email, if: -> { email.present? }
  #   end
  #
  # Every claimable record saved or destroyed in one outermost database transaction (savepoints
  # included) goes into one BeginUpdate, sent from inside that transaction just before its
  # COMMIT (the in-transaction order, docs/cell-integration.md 2b); CommitUpdate follows the
  # COMMIT, RollbackUpdate a rollback. Refusals are validation errors (see ClaimsInvalid).
  module Claimable
    extend ActiveSupport::Concern

    # One claim declaration.
    Declaration = Struct.new(:attribute, :namespace, :condition, :verify_where, keyword_init: true)

    # Every model that included the concern (for TopologyClaims.verify_toml).
    def self.models
      @models ||= []
    end

    included do
      class_attribute :topology_claims_declarations, instance_writer: false, default: []
      class_attribute :topology_claims_owner, instance_writer: false, default: nil
      class_attribute :topology_claims_table, instance_writer: false, default: nil
      class_attribute :topology_claims_config, instance_writer: false, default: nil

      before_save :_topology_claims_snapshot
      before_destroy :_topology_claims_snapshot
      after_save :_topology_claims_enlist
      after_destroy :_topology_claims_enlist
      # A transactional callback keeps the record (strongly) in its transaction's records.
      after_rollback :_topology_claims_rolled_back

      prepend TransactionState
      TopologyClaims::Claimable.models << self
    end

    class_methods do
      # The owner type: :user, :group, :project or any name matching [a-z0-9_]{1,63}
      # (:organization; the server refuses another at the first save, naming the field);
      # owner_value is `value` (default: the id).
      def claims_owner(type, value: :id)
        self.topology_claims_owner = [type.to_s, value.to_sym]
      end

      # The source table the service files this model's claims under: any name matching
      # [a-z0-9_]{1,63} (:users, :ssh_keys); table_record_id is the record id. The cell's
      # verifier lists claims by it (TopologyClaims.verify_toml groups by it).
      def claims_table(name)
        self.topology_claims_table = name.to_s
      end

      # Claims `attribute`'s value in the service's namespace `namespace` ("usernames",
      # "emails", "routes", or one the store holds). The service compares values under the
      # namespace's rules; send them as the user typed them. `type:` (:username, :email, :routes)
      # is the legacy name of a built-in namespace. Blank values are never claimed. `if:` a
      # lambda (run on the record) or a method name. `verify_where:` the same condition in SQL,
      # for TopologyClaims.verify_toml.
      def claim(attribute, namespace: nil, type: nil, if: nil, verify_where: nil)
        if namespace.nil? == type.nil?
          raise ArgumentError, "claim #{attribute.inspect}: give namespace: (or the legacy type:), not both"
        end

        namespace = namespace ? namespace.to_s : Names.namespace_of_type(type)
        declaration = Declaration.new(attribute: attribute.to_sym, namespace: namespace,
                                      condition: binding.local_variable_get(:if), verify_where: verify_where)
        self.topology_claims_declarations = topology_claims_declarations + [declaration]
      end

      # A configuration of this model's own (another cell, another server); default: the
      # process-wide TopologyClaims.configuration.
      def claims_configuration(config)
        self.topology_claims_config = config
      end

      def topology_claims_configuration
        topology_claims_config || TopologyClaims.configuration
      end
    end

    # save returns false when the service refused a claim (the refusal is in errors), as a
    # uniqueness validation would; save! and create! raise ActiveRecord::RecordInvalid.
    def save(**options, &block)
      _topology_claims_row_at_begin { super }
    rescue ClaimsInvalid => e
      errors.add(:base, e.record.errors.full_messages.join(", ")) unless e.record.equal?(self)
      false
    end

    def save!(**options, &block)
      _topology_claims_row_at_begin { super }
    end

    # update(attrs) is save inside a transaction of its own: the service's refusal comes at that
    # transaction's commit, outside save, so it is answered here the same way (false, errors on
    # the form). update! raises ClaimsInvalid, an ActiveRecord::RecordInvalid, as save! does.
    # update_attribute and toggle! go through save. update_column(s), increment! and
    # update_counters write past every callback, so past the claims too: the verifier repairs
    # what they change.
    def update(attributes)
      super
    rescue ClaimsInvalid => e
      errors.add(:base, e.record.errors.full_messages.join(", ")) unless e.record.equal?(self)
      false
    end

    def destroy
      _topology_claims_row_at_begin(destroying: true) { super }
    rescue ClaimsInvalid => e
      errors.add(:base, e.record.errors.full_messages.join(", ")) unless e.record.equal?(self)
      false
    end

    # [[attribute, claim fields]] this record implies now.
    def topology_claims_current
      topology_claims_of(self, id)
    end

    def _topology_claims_before = @_topology_claims_before
    def _topology_claims_enlisted? = @_topology_claims_enlisted

    private

    def topology_claims_of(view, record_id)
      owner_type, owner_attr = self.class.topology_claims_owner ||
                               raise(ConfigurationError, "#{self.class.name}: claims_owner is not declared")
      table = self.class.topology_claims_table ||
              raise(ConfigurationError, "#{self.class.name}: claims_table is not declared")
      self.class.topology_claims_declarations.filter_map do |d|
        condition = d.condition
        next if condition.is_a?(Symbol) && !view.public_send(condition)
        next if condition.respond_to?(:call) && !view.instance_exec(&condition)

        value = view.public_send(d.attribute)
        next if value.nil? || value.to_s.empty?

        [d.attribute, {
          namespace: d.namespace, claim_value: value.to_s,
          **Names.owner_fields(owner_type), owner_value: view.public_send(owner_attr).to_s,
          **Names.table_fields(table), table_record_id: record_id.to_i
        }]
      end
    end

    # On PostgreSQL, a save or destroy about to claim asks the BEGIN it causes, if any, to write
    # the leases_outstanding row in its round trip (BeginWithRow). "About to claim": a new record
    # with a declared value, a change to a declared attribute, or the destroy of a record that
    # holds claims; anything else (an owner or a condition that changed alone) writes the row on
    # its own before BeginUpdate, as always.
    def _topology_claims_row_at_begin(destroying: false)
      collector = _topology_claims_row_collector(destroying)
      return yield unless collector

      collector.want_row
      begin
        yield
      ensure
        collector.unwant_row
      end
    end

    def _topology_claims_row_collector(destroying)
      config = self.class.topology_claims_configuration
      return unless ActiveRecordCompat::BEGIN_WITH_ROW && config.row_at_begin && TopologyClaims.enabled?(config)

      declarations = self.class.topology_claims_declarations
      claiming = if destroying
                   persisted? && declarations.any? { |d| !attribute_in_database(d.attribute.to_s).to_s.empty? }
                 elsif new_record?
                   declarations.any? { |d| !public_send(d.attribute).to_s.empty? }
                 else
                   declarations.any? { |d| will_save_change_to_attribute?(d.attribute) }
                 end
      return unless claiming

      connection = ActiveRecordCompat.connection(self.class)
      return if connection.open_transactions > 1 || LocalTables.dialect(connection) != :postgresql

      collector = Collector.for(connection)
      return if collector.row_wanted? # an enclosing save asked already

      BeginWithRow.install(connection)
      collector
    end

    # The claims the record implied when its transaction began (its values in the database).
    def _topology_claims_snapshot
      return if defined?(@_topology_claims_before) && @_topology_claims_before

      @_topology_claims_before = new_record? ? [] : topology_claims_of(InDatabase.new(self), id_in_database)
    end

    def _topology_claims_enlist
      @_topology_claims_enlisted = true
      connection = ActiveRecordCompat.connection(self.class)
      ActiveRecordCompat.enlist(connection, Collector.for(connection))
    end

    def _topology_claims_rolled_back; end

    def _topology_claims_reset
      @_topology_claims_before = nil
      @_topology_claims_enlisted = false
    end

    # Clears the per-transaction state when ActiveRecord clears its own: after the COMMIT, after a
    # full rollback, or after the rollback of the savepoint the record was first saved in.
    module TransactionState
      def committed!(**options)
        super
      ensure
        send(:_topology_claims_reset)
      end

      def rolledback!(force_restore_state: false, **options)
        super
      ensure
        send(:_topology_claims_reset) if ActiveRecordCompat.transaction_state_ended?(self, force_restore_state)
      end
    end

    # The record as it is in the database: attributes read as attribute_in_database, anything
    # else from the record (for `if:` conditions and the owner value of the old claims).
    class InDatabase
      def initialize(record)
        @record = record
      end

      def id = @record.id_in_database

      def method_missing(name, *args, &block)
        if args.empty? && block.nil? && @record.has_attribute?(name)
          @record.attribute_in_database(name.to_s)
        else
          @record.public_send(name, *args, &block)
        end
      end

      def respond_to_missing?(name, include_private = false)
        @record.respond_to?(name, include_private)
      end
    end
  end

  # The claims of one transaction, as one BeginUpdate: per record, the difference between the
  # claims it implied when the transaction began and those it implies at its end. A changed
  # value is destroy(old) + create(new); a changed owner or record id with the same value is an
  # update; a value that moves between two records of the transaction is an update too (never a
  # destroy and a create of the same claim, which the service refuses as BATCH_CONFLICT).
  class Batch
    attr_reader :creates, :destroys, :updates

    def initialize
      @creates = {}
      @destroys = {}
      @updates = {}
      @holders = {}
    end

    def add(record)
      before = (record._topology_claims_before || []).to_h { |_attr, c| [key(c), c] }
      after = record.new_record? || record.destroyed? ? [] : record.topology_claims_current
      after.each do |attribute, claim|
        k = key(claim)
        @holders[k] = [record, attribute]
        old = before.delete(k)
        if old.nil? then @creates[k] = claim
        elsif old != claim then @updates[k] = claim
        end
      end
      before.each { |k, claim| @destroys[k] = claim }
    end

    def finish
      (@creates.keys & @destroys.keys).each do |k|
        @updates[k] = @creates.delete(k)
        @destroys.delete(k)
      end
      self
    end

    def empty? = @creates.empty? && @destroys.empty? && @updates.empty?
    # Every claim of the batch, [namespace, value as sent].
    def keys = @creates.keys + @destroys.keys + @updates.keys
    def size = @creates.size + @destroys.size + @updates.size

    # [record, attribute] that claims (namespace, value), e.g. ("emails", "a@b").
    def holder(namespace, value)
      @holders[[namespace, value]]
    end

    # [record, attribute] of the claim a request field names, e.g. "creates_claims[1].claim_value"
    # (the lists in the order begin_update sends them).
    def sent_at(field)
      match = /\A(creates|destroys|updates)_claims\[(\d+)\]/.match(field.to_s)
      return unless match

      list = { "creates" => @creates, "destroys" => @destroys, "updates" => @updates }.fetch(match[1])
      k = list.keys[match[2].to_i]
      k && @holders[k]
    end

    # [model, attribute] of a declaration that names `namespace`.
    def declared(namespace)
      @holders.each do |(held_namespace, _), (record, attribute)|
        return [record.class, attribute] if held_namespace == namespace
      end
      nil
    end

    private

    def key(claim) = [claim[:namespace], claim[:claim_value]]
  end

  # One per database connection, enlisted in the connection's transaction beside the claimable
  # records (connection.add_transaction_record). ActiveRecord calls it as it calls a record:
  # before_committed! just before the outermost transaction's COMMIT, then committed! or
  # rolledback!.
  class Collector
    def self.for(connection)
      connection.instance_variable_get(:@topology_claims_collector) ||
        connection.instance_variable_set(:@topology_claims_collector, new(connection))
    end

    def initialize(connection)
      @connection = connection
      @row_wanted = false
      @prewritten = nil
      reset
    end

    def trigger_transactional_callbacks? = true

    # A save about to claim (Claimable#save): the outermost BEGIN it causes writes the
    # leases_outstanding row in its round trip (BeginWithRow).
    def want_row = @row_wanted = true
    def unwant_row = @row_wanted = false
    def row_wanted? = @row_wanted

    # Whether the BEGIN being sent on `connection` is to write the row: a save asked, and the
    # BEGIN is that of a lazily begun outermost transaction with no savepoint yet (it is then
    # the current transaction, where the collector enlists; a savepoint's rollback must not take
    # the row away). A transaction begun eagerly (lazy transactions off) is not on the stack yet
    # at its BEGIN: it keeps the row's own statement.
    def row_at_begin?(connection) = @row_wanted && connection.open_transactions == 1

    # The BEGIN with the row (in one round trip), under a lease id chosen now; the rows of
    # leases committed since go in the same statement. Enlisted in the transaction, so that a
    # rollback gives them back and a commit with nothing to lease deletes the row.
    def begin_with_row
      @row_wanted = false
      lease_id = SecureRandom.uuid
      cleaned = Committed.take(@connection)
      begin
        xid = ActiveRecordCompat.execute_begin(
          @connection, "BEGIN; #{LocalTables.record_statement(@connection, lease_id, cleaned)}"
        )
      rescue StandardError
        Committed.give_back(@connection, cleaned)
        # The BEGIN may have opened a transaction the statement then failed in: ActiveRecord
        # believes none is open, so close it here.
        begin
          @connection.execute("ROLLBACK", "TRANSACTION")
        rescue StandardError
          nil
        end
        raise
      end
      @prewritten = [lease_id, xid, @connection.current_transaction]
      @cleaned = cleaned
      ActiveRecordCompat.enlist(@connection, self)
    end

    # Inside the transaction, after the application's writes, before COMMIT: BeginUpdate, the
    # leases_outstanding row, the staleness guard. Raising here makes ActiveRecord roll back.
    # A row the BEGIN wrote for a transaction with nothing to lease is deleted.
    def before_committed!
      reset
      prewritten = @prewritten
      @prewritten = nil
      # Only this transaction's own row (its commit or rollback clears it in any case).
      prewritten = nil unless prewritten && prewritten[2].equal?(@connection.current_transaction)
      LocalTables.delete(@connection, prewritten[0]) if !lease_claims(prewritten) && prewritten
    end

    def committed!(should_run_callbacks: true, **)
      client, lease_id, keys = @lease
      @cleaned = []
      @prewritten = nil
      reset
      return unless client

      TopologyClaims.instrument("local_committed", lease_id: lease_id, cell_id: client.config.cell_id)
      if client.config.commit_in_background
        Committer.instance.commit(client, lease_id, keys: keys, connection: @connection)
      else
        Committer.send_commit(Committer::Job.new(client: client, lease_id: lease_id, keys: keys,
                                                 connection: @connection))
      end
    end

    # A lease exists only between before_committed! and the end of that same transaction, so
    # a rollback that finds one is that transaction's (a savepoint rolled back earlier finds none).
    def rolledback!(force_restore_state: false, should_run_callbacks: true, **)
      # A savepoint's rollback: the transaction, and whatever it wrote before, goes on.
      return unless force_restore_state

      @prewritten = nil
      lease = @lease&.first(2)
      unconfirmed = @unconfirmed
      Committed.give_back(@connection, @cleaned || [])
      @cleaned = []
      reset
      if lease
        rollback(*lease, attempts: nil)
      elsif unconfirmed
        # No answer to BeginUpdate: one best-effort RollbackUpdate, after the local ROLLBACK, so
        # a request still in flight can never take the claims later.
        rollback(*unconfirmed, attempts: 1)
      end
    end

    private

    def reset
      @lease = nil
      @unconfirmed = nil
    end

    # The validation error each refusal about one claim becomes.
    VALIDATION_ERRORS = { ClaimTaken => :taken, ClaimLeased => :claim_leased,
                          RestoreQuarantine => :restore_quarantine }.freeze
    # The same, by the reason a listed conflict names.
    CONFLICT_ERRORS = { "CLAIM_TAKEN" => :taken, "CLAIM_LEASED" => :claim_leased }.freeze

    # BeginUpdate of the transaction's claims; false when it has none to lease.
    def lease_claims(prewritten)
      records = ActiveRecordCompat.transaction_records(@connection)
      claimables = records.select { |r| r.is_a?(Claimable) && r._topology_claims_enlisted? }
      return false if claimables.empty?

      config = claimables.first.class.topology_claims_configuration
      return false unless TopologyClaims.enabled?(config)

      batch = Batch.new
      claimables.each { |record| batch.add(record) }
      batch.finish
      return false if batch.empty?

      begin_lease(batch, config, prewritten)
      true
    end

    def begin_lease(batch, config, prewritten)
      client = TopologyClaims.client(config)
      # A claim this process's last saves still commit in the background: wait for that commit
      # rather than meet its lease (CLAIM_LEASED).
      Committer.instance.wait_for(batch.keys, config.timeout) if config.commit_in_background
      # The row first (it commits or rolls back with the transaction, whatever BeginUpdate
      # answers), in one statement that also names the local transaction and deletes the rows
      # of leases committed since (given back if the transaction rolls back); or already
      # written by the BEGIN (BeginWithRow).
      if prewritten
        lease_id, xid, = prewritten
        local_transaction = LocalTables.named(@connection, xid)
      else
        lease_id = SecureRandom.uuid
        @cleaned = Committed.take(@connection)
        local_transaction = LocalTables.record(@connection, lease_id, @cleaned)
      end
      sent = monotonic
      begin
        client.begin_update(creates: batch.creates.values, destroys: batch.destroys.values,
                            updates: batch.updates.values, lease_id: lease_id,
                            local_transaction: local_transaction.to_s, deadline: config.in_transaction_deadline,
                            wait_for_leased: TopologyClaims.lease_wait)
      rescue CircuitOpen
        raise # not sent: nothing to clean up
      rescue Unavailable
        @unconfirmed = [client, lease_id]
        raise
      rescue UnknownNamespace => e
        model, attribute = batch.declared(e.namespace)
        raise e unless model

        raise UnknownNamespace.new("#{model.name}##{attribute}: #{e.message}", reason: e.reason, code: e.code,
                                                                                metadata: e.metadata)
      rescue InvalidClaimValue => e
        record, attribute = batch.sent_at(e.field)
        raise unless record

        record.errors.add(attribute, :invalid_claim_value, rule: e.rule)
        raise ClaimsInvalid.new(record, e)
      rescue ClaimTaken, ClaimLeased, RestoreQuarantine => e
        record, attribute = batch.holder(e.namespace, e.claim_value)
        raise unless record

        record.errors.add(attribute, VALIDATION_ERRORS.fetch(e.class), value: e.claim_value)
        # Every other refused claim of the batch too (the server lists them all), so the form
        # shows each taken name at once.
        e.conflicts.drop(1).each do |conflict|
          error = CONFLICT_ERRORS[conflict.reason]
          other, other_attribute = batch.holder(conflict.namespace, conflict.claim_value)
          other&.errors&.add(other_attribute, error, value: conflict.claim_value) if error
        end
        raise ClaimsInvalid.new(record, e)
      end
      @lease = [client, lease_id, batch.keys]
      TopologyClaims.instrument("lease_begun", lease_id: lease_id, cell_id: config.cell_id, claims: batch.size,
                                               local_transaction: local_transaction)
      elapsed = monotonic - sent
      return if elapsed <= config.commit_window

      raise StaleLease, "lease #{lease_id}: BeginUpdate was sent #{elapsed.round(1)}s ago, beyond the commit window " \
                        "of #{config.commit_window}s (staleness - safety_margin); the transaction was rolled back"
    end

    def rollback(client, lease_id, attempts:)
      client.rollback_update(lease_id, attempts: attempts, counted: false)
    rescue Error => e
      TopologyClaims.metrics.increment(:rollback_failures)
      TopologyClaims.logger.warn("topology_claims: #{e.message}; the reconciler will roll back lease #{lease_id}")
    end

    def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end
end
