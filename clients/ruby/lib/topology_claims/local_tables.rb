# frozen_string_literal: true

module TopologyClaims
  # The cell's local tables, exactly as the Rust cell library and the sidecars
  # (`topology-claims reconcile` / `verify`) have them (docs/cell-integration.md, section 1), so
  # that the sidecars run against the application's database unchanged.
  module LocalTables
    POSTGRESQL_DDL = <<~SQL
      CREATE TABLE IF NOT EXISTS leases_outstanding (
          lease_id   uuid        PRIMARY KEY,
          created_at timestamptz NOT NULL,
          updated_at timestamptz NOT NULL
      );
      CREATE INDEX IF NOT EXISTS idx_leases_outstanding_created ON leases_outstanding (created_at);
      CREATE TABLE IF NOT EXISTS topology_claims_locks (
          name       text        PRIMARY KEY,
          holder     text        NOT NULL,
          expires_at timestamptz NOT NULL
      );
    SQL

    # created_at / updated_at / expires_at are unix microseconds.
    SQLITE_DDL = <<~SQL
      CREATE TABLE IF NOT EXISTS leases_outstanding (
          lease_id   TEXT    NOT NULL PRIMARY KEY,
          created_at INTEGER NOT NULL,
          updated_at INTEGER NOT NULL
      );
      CREATE INDEX IF NOT EXISTS leases_outstanding_by_created_at
          ON leases_outstanding (created_at);
      CREATE TABLE IF NOT EXISTS topology_claims_locks (
          name       TEXT    NOT NULL PRIMARY KEY,
          holder     TEXT    NOT NULL,
          expires_at INTEGER NOT NULL
      );
    SQL

    module_function

    # :postgresql or :sqlite, from the connection's adapter; other adapters are refused.
    def dialect(connection)
      case connection.adapter_name
      when /postg/i then :postgresql
      when /sqlite/i then :sqlite
      else raise ConfigurationError, "the #{connection.adapter_name} adapter is not supported (PostgreSQL or SQLite)"
      end
    end

    def ddl(connection)
      dialect(connection) == :postgresql ? POSTGRESQL_DDL : SQLITE_DDL
    end

    def create!(connection)
      ddl(connection).split(";").map(&:strip).reject(&:empty?).each { |sql| connection.execute(sql) }
    end

    # Inside the cell's transaction: recording the same id again is a no-op. Returns the
    # transaction's `local_transaction` (see below), read by the same statement on PostgreSQL.
    # `committed`: rows of leases the service has committed, deleted by the same statement.
    def record(connection, lease_id, committed = [])
      if dialect(connection) == :postgresql
        named(connection, connection.select_value(record_statement(connection, lease_id, committed)))
      else
        delete_committed(connection, committed)
        micros = Process.clock_gettime(Process::CLOCK_REALTIME, :microsecond)
        connection.execute(
          "INSERT INTO leases_outstanding (lease_id, created_at, updated_at) " \
          "VALUES (#{connection.quote(lease_id)}, #{micros}, #{micros}) ON CONFLICT(lease_id) DO NOTHING"
        )
        nil
      end
    end

    # The PostgreSQL statement of `record`: the row of `lease_id`, the deletion of the rows of
    # `committed`, and the transaction's id (xid8) as it returns. Sent on its own, or in the
    # round trip of the transaction's BEGIN (BeginWithRow).
    def record_statement(connection, lease_id, committed)
      now = zoned?(connection) ? "clock_timestamp()" : "(clock_timestamp() AT TIME ZONE 'UTC')"
      cleaned = if committed.empty? then ""
                else
                  "WITH cleaned AS (DELETE FROM leases_outstanding WHERE lease_id IN " \
                    "(#{committed.map { |id| "#{connection.quote(id)}::uuid" }.join(', ')})) "
                end
      "#{cleaned}INSERT INTO leases_outstanding (lease_id, created_at, updated_at) " \
        "VALUES (#{connection.quote(lease_id)}::uuid, #{now}, #{now}) " \
        "ON CONFLICT (lease_id) DO NOTHING RETURNING pg_current_xact_id()::text"
    end

    # The local_transaction of the open transaction whose record_statement returned `xid` (nil:
    # the row was there already, and the transaction is asked for its id).
    def named(connection, xid)
      xid ? "pg:#{system_identifier(connection)}:#{xid}" : local_transaction(connection)
    end

    # The cluster's system identifier, read once per connection (pg_control_system() reads the
    # control file: a file read per save otherwise). A connection talks to one cluster for its
    # life; a reconnect (another server after a failover) reads it again.
    def system_identifier(connection)
      raw = ActiveRecordCompat.driver_connection(connection)
      cached = connection.instance_variable_get(:@topology_claims_system_identifier)
      return cached[1] if raw && cached && cached[0].equal?(raw)

      id = connection.select_value("SELECT system_identifier::text FROM pg_control_system()")
      connection.instance_variable_set(:@topology_claims_system_identifier, [raw, id])
      id
    end

    # Whether leases_outstanding.created_at is `timestamptz` (the gem's DDL), or `timestamp
    # without time zone` (a table recreated from schema.rb, which dumps both as t.datetime):
    # then the gem writes UTC wall times, which the sidecars compare in UTC sessions
    # (decision 113). Asked once per connection pool.
    def zoned?(connection)
      @zoned ||= {}
      key = connection.pool.object_id
      return @zoned[key] if @zoned.key?(key)

      @zoned[key] = connection.select_value(
        "SELECT atttypid = 'timestamptz'::regtype FROM pg_attribute " \
        "WHERE attrelid = 'leases_outstanding'::regclass AND attname = 'created_at'"
      ) != false
    end

    def delete(connection, lease_id)
      delete_committed(connection, [lease_id])
    end

    # Deletes the rows of `lease_ids` (leases the service has committed) in one statement.
    def delete_committed(connection, lease_ids)
      return if lease_ids.empty?

      cast = dialect(connection) == :postgresql ? "::uuid" : ""
      list = lease_ids.map { |id| "#{connection.quote(id)}#{cast}" }.join(", ")
      connection.execute("DELETE FROM leases_outstanding WHERE lease_id IN (#{list})")
    end

    # `pg:<system_identifier>:<xid8>` of the open PostgreSQL transaction (giving it an id now if
    # it has none), the BeginUpdate's local_transaction; nil on SQLite, which has none to name.
    def local_transaction(connection)
      return nil unless dialect(connection) == :postgresql

      system, xid = connection.select_rows(
        "SELECT system_identifier::text, pg_current_xact_id()::text FROM pg_control_system()"
      ).first
      "pg:#{system}:#{xid}"
    end
  end

  # The leases_outstanding rows of committed leases, waiting to be deleted: by the next claims
  # transaction on the same database (one more statement inside a transaction that commits
  # anyway, instead of a durable transaction of its own per save), or by clean_up!. A row left
  # behind (the process exits first) is harmless: the cell's reconciler commits its lease again
  # (idempotent) and deletes it once it is older than its threshold.
  module Committed
    # Most ids one database's list holds; past it, the oldest are left to the reconciler.
    MAX_PENDING = 10_000
    # Most ids one transaction deletes.
    BATCH = 500

    @mutex = Mutex.new
    @pending = Hash.new { |h, k| h[k] = [] }.compare_by_identity

    module_function

    # The database a connection writes to (one list per connection pool).
    def key(connection) = connection.pool

    def add(connection, lease_id)
      @mutex.synchronize do
        list = @pending[key(connection)]
        list << lease_id
        list.shift(list.size - MAX_PENDING) if list.size > MAX_PENDING
      end
    end

    # Up to BATCH ids to delete in `connection`'s transaction (give them back if it rolls back).
    def take(connection)
      @mutex.synchronize { @pending[key(connection)].shift(BATCH) }
    end

    def give_back(connection, lease_ids)
      @mutex.synchronize { @pending[key(connection)].unshift(*lease_ids) } unless lease_ids.empty?
    end

    def pending(connection) = @mutex.synchronize { @pending[key(connection)].size }

    # At a clean exit: every pool's rows, each on a connection of its own pool (best effort: a
    # row left is the reconciler's).
    def flush_all
      pools = @mutex.synchronize { @pending.keys }
      pools.each do |pool|
        pool.with_connection { |connection| TopologyClaims.clean_up!(connection) }
      rescue StandardError => e
        TopologyClaims.logger.warn("topology_claims: deleting committed leases_outstanding rows at exit failed " \
                                   "(the reconciler removes them): #{e.message}")
      end
    end
  end
  at_exit { Committed.flush_all }

  # Deletes every leases_outstanding row this process knows to be committed, for the database
  # of `connection`, now (in its own transaction unless one is open). Saves do this in their
  # next claims transaction; call it before counting the rows (tests) or at a clean shutdown.
  def self.clean_up!(connection = ::ActiveRecord::Base.connection)
    loop do
      ids = Committed.take(connection)
      break if ids.empty?

      begin
        LocalTables.delete_committed(connection, ids)
      rescue StandardError
        Committed.give_back(connection, ids)
        raise
      end
    end
  end

  # Creates leases_outstanding and topology_claims_locks in `connection`'s database if they are
  # missing (idempotent). In a Rails migration: `TopologyClaims.create_local_tables!(connection)`.
  def self.create_local_tables!(connection = ::ActiveRecord::Base.connection)
    LocalTables.create!(connection)
  end
end
