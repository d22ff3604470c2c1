# frozen_string_literal: true

module TopologyClaims
  # The one place that knows ActiveRecord's versions. The gem takes any ActiveRecord from 6.1 on.
  # What it relies on (the transaction-record protocol, Transaction#records,
  # @_start_transaction_state) is unchanged from 6.1 to 8.0 in Rails' source
  # (transaction.rb, transactions.rb); only how a model reaches its connection changed, in 7.2.
  # The specs run on Debian's 6.1 (README, "Rails versions").
  module ActiveRecordCompat
    VERSION = ::ActiveRecord.gem_version
    MINIMUM = Gem::Version.new("6.1")
    # Read in Rails' source up to this version; a later one is loaded with a warning.
    READ_UP_TO = Gem::Version.new("8.1")
    # 7.2: Model.connection is soft-deprecated for with_connection / lease_connection
    # (connection_handling.rb).
    LEASE_API = VERSION >= Gem::Version.new("7.2")
    # Up to 7.0 the PostgreSQL adapter's BEGIN is `execute("BEGIN", "TRANSACTION")` from
    # begin_db_transaction, which BeginWithRow extends (decision 125). 7.1 sends it through
    # internal_execute, which the specs have not run on: there the row keeps its own statement.
    BEGIN_WITH_ROW = VERSION < Gem::Version.new("7.1")

    module_function

    # Raises below 6.1 (the transaction-record protocol's keywords came with 6.1).
    def check!
      return if VERSION >= MINIMUM

      raise Error, "topology_claims needs ActiveRecord 6.1 or later, not #{VERSION}"
    end

    # A warning to log once, or nil.
    def warning
      return if VERSION < READ_UP_TO

      "topology_claims: ActiveRecord #{VERSION} is newer than the versions whose transaction internals the gem " \
        "was checked against (6.1 to 8.0); its specs ran on 6.1 (README, \"Rails versions\")"
    end

    # The connection of `model` inside its transaction.
    def connection(model)
      LEASE_API ? model.lease_connection : model.connection
    end

    # Enlists `hook` in the connection's current transaction: it gets before_committed! before the
    # outermost COMMIT (raising rolls the transaction back), then committed! or rolledback!.
    def enlist(connection, hook) = connection.add_transaction_record(hook)

    # Sends `sql`, a BEGIN and one statement after it, as the BEGIN of the transaction being
    # materialized (BeginWithRow); returns the first value the statement returned, or nil.
    def execute_begin(connection, sql)
      result = connection.execute(sql, "TRANSACTION")
      value = result.ntuples.zero? ? nil : result.getvalue(0, 0)
      result.clear
      value
    end

    # The driver's connection (a PG::Connection) under `connection`, as a cache key only, or nil.
    # Not `raw_connection`: up to 7.0 that turns off the adapter's lazy transactions (BEGIN is
    # then sent even for a transaction that runs no statement, and BeginWithRow cannot apply)
    # until the connection goes back to its pool.
    def driver_connection(connection)
      connection.instance_variable_get(:@raw_connection) || connection.instance_variable_get(:@connection)
    end

    # The records enlisted in the connection's current transaction (read in before_committed!).
    def transaction_records(connection)
      (connection.current_transaction.records || []).uniq(&:__id__)
    end

    # After a record's rolledback!: whether it has left its transaction (the outermost one's
    # rollback, or the savepoint it was first saved in).
    def transaction_state_ended?(record, force_restore_state)
      force_restore_state || record.instance_variable_get(:@_start_transaction_state).nil?
    end
  end
end
