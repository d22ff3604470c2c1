# frozen_string_literal: true

# Two cells of one platform, each a small ActiveRecord application with its own SQLite database,
# claiming usernames and emails through topology-claims. Run by ./run.sh, which starts the
# server; the first cell's configuration comes from TOPOLOGY_CLAIMS_SERVER / _CELL_ID.
require "active_record"
require "logger"
require "topology_claims"

work = ARGV.fetch(0)

# One cell: its database and its models. The process-wide configuration is cell-eu's (from the
# environment); cell-us gets a configuration of its own.
def build_cell(name, work, config)
  namespace = Object.const_set(name.split("-").map(&:capitalize).join, Module.new)
  namespace.module_eval <<~RUBY, __FILE__, __LINE__ + 1
    class Record < ActiveRecord::Base
      self.abstract_class = true
    end

    class User < Record
      self.table_name = "users"
      include TopologyClaims::Claimable
      claims_owner :user
      claims_table :users
      claim :username, namespace: "usernames"
      claim :email, namespace: "emails", if: -> { email.present? }
    end
  RUBY
  namespace::Record.establish_connection(adapter: "sqlite3", database: File.join(work, "#{name}.sqlite3"))
  namespace::User.claims_configuration(config)
  connection = namespace::Record.connection
  connection.create_table(:users, if_not_exists: true) do |t|
    t.string :username, null: false
    t.string :email
    t.timestamps
  end
  TopologyClaims.create_local_tables!(connection)
  namespace
end

eu = build_cell("cell-eu", work, TopologyClaims.configuration)
us_config = TopologyClaims::Configuration.new.dup_with(cell_id: "cell-us")
us = build_cell("cell-us", work, us_config)

# What a signup form shows.
def signup(cell, label, username, email)
  user = cell::User.new(username: username, email: email)
  if user.save
    puts "#{label}: signed up #{username} <#{email}> (user #{user.id})"
  else
    puts "#{label}: form errors for #{username} <#{email}>:"
    user.errors.full_messages.each { |message| puts "  - #{message}" }
  end
rescue TopologyClaims::Unavailable => e
  puts "#{label}: the claims service is unavailable, try again later (#{e.message})"
end

signup(eu, "cell-eu", "alice", "alice@example.com")
signup(us, "cell-us", "alice", "alice@example.org")       # username taken by cell-eu
signup(us, "cell-us", "alice2", "alice@example.com")      # email taken by cell-eu
signup(us, "cell-us", "bob", "bob@example.com")

alice = eu::User.find_by!(username: "alice")
alice.update!(email: "alice@new.example.com")              # frees the old email, claims the new one
puts "cell-eu: alice's email is now #{alice.email}"
signup(us, "cell-us", "alice3", "alice@example.com")      # free again

lookup = TopologyClaims.client.lookup_claim("emails", "alice@new.example.com")
puts "LookupClaim email alice@new.example.com: #{lookup.cell_id} #{TopologyClaims::Names.short(lookup.state)}"

File.write(File.join(work, "verify.toml"), TopologyClaims.verify_toml(eu::Record.connection, models: [eu::User]))
puts "wrote verify.toml for cell-eu"
