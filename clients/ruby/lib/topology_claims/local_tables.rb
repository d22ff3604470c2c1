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

    # Inside the cell's transaction: recording the same id again is a no-op.
    def record(connection, lease_id)
      if dialect(connection) == :postgresql
        connection.execute(
          "INSERT INTO leases_outstanding (lease_id, created_at, updated_at) " \
          "VALUES (#{connection.quote(lease_id)}::uuid, clock_timestamp(), clock_timestamp()) " \
          "ON CONFLICT (lease_id) DO NOTHING"
        )
      else
        micros = Process.clock_gettime(Process::CLOCK_REALTIME, :microsecond)
        connection.execute(
          "INSERT INTO leases_outstanding (lease_id, created_at, updated_at) " \
          "VALUES (#{connection.quote(lease_id)}, #{micros}, #{micros}) ON CONFLICT(lease_id) DO NOTHING"
        )
      end
    end

    def delete(connection, lease_id)
      cast = dialect(connection) == :postgresql ? "::uuid" : ""
      connection.execute("DELETE FROM leases_outstanding WHERE lease_id = #{connection.quote(lease_id)}#{cast}")
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

  # Creates leases_outstanding and topology_claims_locks in `connection`'s database if they are
  # missing (idempotent). In a Rails migration: `TopologyClaims.create_local_tables!(connection)`.
  def self.create_local_tables!(connection = ::ActiveRecord::Base.connection)
    LocalTables.create!(connection)
  end
end
