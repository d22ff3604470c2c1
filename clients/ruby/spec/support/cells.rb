# frozen_string_literal: true

require "active_record"
require "topology_claims"

# A cell of the specs: its own local database (SQLite file or PostgreSQL database), its own
# TopologyClaims::Configuration (cell id, server) and its own model classes, so that two cells
# live in one process. Also loaded by spec/support/cell_worker.rb, in processes of their own.
module Cells
  PG = { host: ENV.fetch("TC_RUBY_PGHOST", "127.0.0.1"), port: Integer(ENV.fetch("TC_RUBY_PGPORT", "5432")),
         user: ENV.fetch("TC_RUBY_PGUSER", "postgres") }.freeze

  Cell = Struct.new(:adapter, :name, :cell_id, :database, :config, :base, :user, :email, keyword_init: true) do
    def connection = base.connection

    # The sidecars' --local-db.
    def local_db_url
      if adapter == :sqlite then "sqlite://#{database}"
      else "postgres://#{PG[:user]}@#{PG[:host]}:#{PG[:port]}/#{database}"
      end
    end

    def client = TopologyClaims.client(config)

    # The rows left once this process's committed leases are cleaned up (saves delete them in
    # the next claims transaction).
    def leases_outstanding
      TopologyClaims::Committer.instance.drain
      TopologyClaims.clean_up!(connection)
      connection.select_value("SELECT count(*) FROM leases_outstanding").to_i
    end

    # The environment of a spec/support/cell_worker.rb process for this cell.
    def worker_env
      { "TC_ADAPTER" => adapter.to_s, "TC_CELL" => name, "TC_CELL_ID" => cell_id, "TC_DB" => database,
        "TC_SERVER" => config.address }
    end
  end

  module_function

  # `database`: the SQLite path, or the PostgreSQL database name. `fresh`: drop and create it.
  def build(adapter:, name:, cell_id:, database:, address:, fresh: true, config: {})
    prepare_database(adapter, database) if fresh
    configuration = TopologyClaims::Configuration.new({})
    configuration.address = address
    configuration.cell_id = cell_id
    # A debug server on a busy 2-core machine can take longer than the 200 ms default.
    configuration.in_transaction_deadline = Float(ENV.fetch("TC_RUBY_IN_TRANSACTION_DEADLINE", "2"))
    config.each { |k, v| configuration.public_send("#{k}=", v) }

    namespace = Module.new
    Cells.const_set(const_name(name), namespace)
    base = Class.new(ActiveRecord::Base)
    namespace.const_set(:Record, base)
    base.abstract_class = true
    base.establish_connection(connection_config(adapter, database))

    user = Class.new(base)
    namespace.const_set(:User, user)
    user.class_eval do
      self.table_name = "users"
      include TopologyClaims::Claimable
      claims_owner :user
      claims_table :users
      claim :username, namespace: "usernames"
      claim :email, type: :email, if: -> { email.present? } # the legacy name of "emails"
      claims_configuration configuration
      has_many :emails, class_name: "#{namespace.name}::Email", foreign_key: :user_id
    end
    email = Class.new(base)
    namespace.const_set(:Email, email)
    email.class_eval do
      self.table_name = "emails"
      include TopologyClaims::Claimable
      claims_owner :user, value: :user_id
      claims_table :emails
      claim :email, type: :email
      claims_configuration configuration
    end

    cell = Cell.new(adapter: adapter, name: name, cell_id: cell_id, database: database,
                    config: configuration, base: base, user: user, email: email)
    create_tables(cell) if fresh
    cell
  end

  def const_name(name) = name.split(/[^A-Za-z0-9]/).map(&:capitalize).join

  def connection_config(adapter, database)
    if adapter == :sqlite
      { adapter: "sqlite3", database: database, pool: 5, timeout: 5000 }
    else
      { adapter: "postgresql", database: database, host: PG[:host], port: PG[:port], username: PG[:user], pool: 5 }
    end
  end

  def prepare_database(adapter, database)
    if adapter == :sqlite
      Dir.glob("#{database}*").each { |f| File.delete(f) }
    else
      require "pg"
      admin = ::PG.connect(host: PG[:host], port: PG[:port], user: PG[:user], dbname: "postgres")
      admin.exec("SET client_min_messages TO warning")
      admin.exec("DROP DATABASE IF EXISTS #{admin.quote_ident(database)} WITH (FORCE)")
      admin.exec("CREATE DATABASE #{admin.quote_ident(database)}")
      admin.close
    end
  end

  def create_tables(cell)
    connection = cell.connection
    connection.create_table(:users, force: true) do |t|
      t.string :username, null: false
      t.string :email
      t.timestamps
    end
    connection.create_table(:emails, force: true) do |t|
      t.bigint :user_id, null: false
      t.string :email, null: false
      t.timestamps
    end
    TopologyClaims.create_local_tables!(connection)
  end
end
